package trends.bench.peers;

import org.apache.datasketches.hll.HllSketch;
import org.apache.datasketches.hll.TgtHllType;
import org.apache.datasketches.hll.Union;
import org.apache.datasketches.memory.Memory;
import org.apache.flink.api.common.typeutils.SimpleTypeSerializerSnapshot;
import org.apache.flink.api.common.typeutils.TypeSerializerSnapshot;
import org.apache.flink.table.annotation.DataTypeHint;
import org.apache.flink.table.annotation.FunctionHint;
import org.apache.flink.table.functions.AggregateFunction;

/** hll_sketch_agg(user, 12) as Spark computes it: an HLL_8 sketch of lg_k 12, returned as its compact binary. */
@FunctionHint(
    accumulator = @DataTypeHint(value = "RAW", bridgedTo = HllSketchAgg.Acc.class, rawSerializer = HllSketchAgg.Serializer.class),
    output = @DataTypeHint("BYTES"))
public class HllSketchAgg extends AggregateFunction<byte[], HllSketchAgg.Acc> {
  static final int LG_K = 12;

  /** The running sketch. */
  public static class Acc {
    public HllSketch sketch = new HllSketch(LG_K, TgtHllType.HLL_8);
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
      return acc.sketch.toUpdatableByteArray();
    }

    @Override
    protected Acc fromBytes(byte[] bytes) {
      Acc acc = new Acc();
      acc.sketch = HllSketch.heapify(Memory.wrap(bytes));
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

  public void accumulate(Acc acc, String value) {
    if (value != null) {
      acc.sketch.update(value);
    }
  }

  public void merge(Acc acc, Iterable<Acc> others) {
    Union union = new Union(LG_K);
    union.update(acc.sketch);
    for (Acc other : others) {
      union.update(other.sketch);
    }
    acc.sketch = union.getResult(TgtHllType.HLL_8);
  }

  @Override
  public byte[] getValue(Acc acc) {
    return acc.sketch.toCompactByteArray();
  }
}
