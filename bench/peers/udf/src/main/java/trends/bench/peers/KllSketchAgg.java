package trends.bench.peers;

import org.apache.datasketches.kll.KllDoublesSketch;
import org.apache.datasketches.memory.Memory;
import org.apache.flink.api.common.typeutils.SimpleTypeSerializerSnapshot;
import org.apache.flink.api.common.typeutils.TypeSerializerSnapshot;
import org.apache.flink.table.annotation.DataTypeHint;
import org.apache.flink.table.annotation.FunctionHint;
import org.apache.flink.table.functions.AggregateFunction;

/** kll_sketch_agg_double(value) as Spark computes it: a KLL doubles sketch of k 200, returned as its binary. */
@FunctionHint(
    accumulator = @DataTypeHint(value = "RAW", bridgedTo = KllSketchAgg.Acc.class, rawSerializer = KllSketchAgg.Serializer.class),
    output = @DataTypeHint("BYTES"))
public class KllSketchAgg extends AggregateFunction<byte[], KllSketchAgg.Acc> {
  static final int K = 200;

  /** The running sketch. */
  public static class Acc {
    public KllDoublesSketch sketch = KllDoublesSketch.newHeapInstance(K);
  }

  /** The accumulator's serializer: the sketch's binary. */
  public static final class Serializer extends SketchSerializer<Acc> {
    public static final Serializer INSTANCE = new Serializer();

    @Override
    public Acc createInstance() {
      return new Acc();
    }

    @Override
    protected byte[] toBytes(Acc acc) {
      return acc.sketch.toByteArray();
    }

    @Override
    protected Acc fromBytes(byte[] bytes) {
      Acc acc = new Acc();
      acc.sketch = KllDoublesSketch.heapify(Memory.wrap(bytes));
      return acc;
    }

    @Override
    public TypeSerializerSnapshot<Acc> snapshotConfiguration() {
      return new Snapshot();
    }

    /** Restores the serializer from a checkpoint. */
    public static final class Snapshot extends SimpleTypeSerializerSnapshot<Acc> {
      public Snapshot() {
        super(() -> INSTANCE);
      }
    }
  }

  @Override
  public Acc createAccumulator() {
    return new Acc();
  }

  public void accumulate(Acc acc, Double value) {
    if (value != null) {
      acc.sketch.update(value);
    }
  }

  public void merge(Acc acc, Iterable<Acc> others) {
    for (Acc other : others) {
      acc.sketch.merge(other.sketch);
    }
  }

  @Override
  public byte[] getValue(Acc acc) {
    return acc.sketch.toByteArray();
  }
}
