package trends.bench.peers;

import org.apache.datasketches.common.ArrayOfStringsSerDe;
import org.apache.datasketches.frequencies.ItemsSketch;
import org.apache.datasketches.memory.Memory;
import org.apache.flink.api.common.typeutils.SimpleTypeSerializerSnapshot;
import org.apache.flink.api.common.typeutils.TypeSerializerSnapshot;
import org.apache.flink.table.annotation.DataTypeHint;
import org.apache.flink.table.annotation.FunctionHint;
import org.apache.flink.table.functions.AggregateFunction;

/** approx_top_k_accumulate(item, 1024).sketch as Spark computes it: frequent strings, max map size 2048. */
@FunctionHint(
    accumulator = @DataTypeHint(value = "RAW", bridgedTo = ItemsSketchAgg.Acc.class, rawSerializer = ItemsSketchAgg.Serializer.class),
    output = @DataTypeHint("BYTES"))
public class ItemsSketchAgg extends AggregateFunction<byte[], ItemsSketchAgg.Acc> {
  static final int MAX_MAP_SIZE = 2048;
  static final ArrayOfStringsSerDe SERDE = new ArrayOfStringsSerDe();

  /** The running sketch. */
  public static class Acc {
    public ItemsSketch<String> sketch = new ItemsSketch<>(MAX_MAP_SIZE);
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
      return acc.sketch.toByteArray(SERDE);
    }

    @Override
    protected Acc fromBytes(byte[] bytes) {
      Acc acc = new Acc();
      acc.sketch = ItemsSketch.getInstance(Memory.wrap(bytes), SERDE);
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

  public void accumulate(Acc acc, String item) {
    if (item != null) {
      acc.sketch.update(item);
    }
  }

  public void merge(Acc acc, Iterable<Acc> others) {
    for (Acc other : others) {
      acc.sketch.merge(other.sketch);
    }
  }

  @Override
  public byte[] getValue(Acc acc) {
    return acc.sketch.toByteArray(SERDE);
  }
}
