package trends.bench.peers;

import java.io.IOException;
import org.apache.flink.api.common.typeutils.base.TypeSerializerSingleton;
import org.apache.flink.core.memory.DataInputView;
import org.apache.flink.core.memory.DataOutputView;

/** Serializes a sketch accumulator as its DataSketches binary, so Flink never reflects into the sketch's classes. */
public abstract class SketchSerializer<T> extends TypeSerializerSingleton<T> {
  protected abstract byte[] toBytes(T acc);

  protected abstract T fromBytes(byte[] bytes);

  @Override
  public boolean isImmutableType() {
    return false;
  }

  @Override
  public T copy(T from) {
    return fromBytes(toBytes(from));
  }

  @Override
  public T copy(T from, T reuse) {
    return copy(from);
  }

  @Override
  public int getLength() {
    return -1;
  }

  @Override
  public void serialize(T record, DataOutputView target) throws IOException {
    byte[] bytes = toBytes(record);
    target.writeInt(bytes.length);
    target.write(bytes);
  }

  @Override
  public T deserialize(DataInputView source) throws IOException {
    byte[] bytes = new byte[source.readInt()];
    source.readFully(bytes);
    return fromBytes(bytes);
  }

  @Override
  public T deserialize(T reuse, DataInputView source) throws IOException {
    return deserialize(source);
  }

  @Override
  public void copy(DataInputView source, DataOutputView target) throws IOException {
    int length = source.readInt();
    target.writeInt(length);
    target.write(source, length);
  }
}
