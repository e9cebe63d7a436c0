using System.Buffers;
using System.Collections.Concurrent;

namespace Tern.Proxy.Tls.OpenSsl;

/// <summary>
/// 16 KB blocks (one full TLS record of plaintext each) for the pipe Kestrel writes responses
/// into. Blocks and their owner objects are reused, so renting allocates nothing once the pool
/// holds as many blocks as are in flight; blocks returned beyond a retention limit are left to the
/// GC. (The shared array pool keeps only a few dozen arrays per size: with many connections
/// streaming, it ran dry and every record allocated.)
/// </summary>
internal sealed class RecordBufferPool : MemoryPool<byte>
{
    public const int BlockSize = 16 * 1024;

    // 64 MB of idle blocks at most.
    private const int MaxRetained = 4096;

    private readonly ConcurrentQueue<Block> _free = new();
    private int _retained;

    public static RecordBufferPool Instance { get; } = new();

    public override int MaxBufferSize => BlockSize;

    public override IMemoryOwner<byte> Rent(int minBufferSize = -1)
    {
        ArgumentOutOfRangeException.ThrowIfGreaterThan(minBufferSize, BlockSize);
        if (_free.TryDequeue(out var block))
        {
            Interlocked.Decrement(ref _retained);
            return block;
        }

        return new Block(this);
    }

    protected override void Dispose(bool disposing)
    {
        // Shared for the process: nothing to release early.
    }

    private void Return(Block block)
    {
        if (Interlocked.Increment(ref _retained) <= MaxRetained)
        {
            _free.Enqueue(block);
        }
        else
        {
            Interlocked.Decrement(ref _retained);
        }
    }

    private sealed class Block(RecordBufferPool pool) : IMemoryOwner<byte>
    {
        // Pinned: OpenSSL reads it during native calls, and pinning a movable array per call costs more.
        private readonly byte[] _array = GC.AllocateUninitializedArray<byte>(BlockSize, pinned: true);

        public Memory<byte> Memory => _array;

        public void Dispose() => pool.Return(this);
    }
}
