using System.Buffers;
using Microsoft.AspNetCore.Connections;

namespace Tern.Proxy.Listeners;

/// <summary>
/// The memory behind every connection's pipes: pinned 16 KB blocks, one full TLS record each.
/// Kestrel's socket transport takes it in place of its own pool of 4 KB blocks (Tern registers it
/// as the <see cref="IMemoryPoolFactory{T}"/>), so a socket read takes up to 16 KB instead of 4 KB;
/// the OpenSSL engine decrypts a whole record into one block and writes one into at most two, and
/// Kestrel writes responses into its own pipe's blocks, one record each. With 4 KB blocks a 1 MB
/// upload cost 517 socket reads (each 4 KB read after a 1-byte peek: Kestrel waits for data before
/// it takes a block) and 1.3-1.4x the CPU (loadtest/README.md, "16 KB blocks under every socket").
/// </summary>
/// <remarks>
/// Free blocks and their owner objects are reused, so renting allocates nothing once the pool
/// holds as many blocks as are in flight. An idle connection holds none: Kestrel takes a block
/// only when the socket has data. At most <see cref="MaxRetained"/> free blocks are kept, and every
/// <see cref="TrimInterval"/> half of those that no rent needed over the interval go back to the
/// garbage collector, which frees pinned arrays in its next full collection. (The shared array pool
/// keeps only a few dozen arrays per size: with many connections streaming it ran dry and every
/// record allocated.)
/// </remarks>
internal sealed class BlockPool : MemoryPool<byte>, IMemoryPoolFactory<byte>
{
    public const int BlockSize = 16 * 1024;

    /// <summary>64 MB of free blocks at most.</summary>
    public const int MaxRetained = 4096;

    public static readonly TimeSpan TrimInterval = TimeSpan.FromSeconds(10);

    // Free blocks, last returned on top: the next rent takes the block most likely still in the
    // CPU's caches (a queue handed out the one returned longest ago, which is the coldest).
    private readonly Block[] _free = new Block[MaxRetained];
    private readonly Lock _lock = new();
    private readonly Timer? _trim;
    private int _count;

    // The fewest free blocks seen since the last trim: that many were not needed all interval.
    private int _lowWater;

    /// <param name="trimEvery">How often unused free blocks are released; infinite for none (tests call <see cref="Trim"/>).</param>
    internal BlockPool(TimeSpan trimEvery)
    {
        if (trimEvery != Timeout.InfiniteTimeSpan)
        {
            _trim = new Timer(static pool => ((BlockPool)pool!).Trim(), this, trimEvery, trimEvery);
        }
    }

    /// <summary>The process's pool, shared by every listener and connection.</summary>
    public static BlockPool Instance { get; } = new(TrimInterval);

    public override int MaxBufferSize => BlockSize;

    /// <summary>Free blocks held for reuse.</summary>
    public int Retained => Volatile.Read(ref _count);

    /// <summary>Kestrel asks once per listener; every listener shares the one pool.</summary>
    public MemoryPool<byte> Create(MemoryPoolOptions? options = null) => this;

    public override IMemoryOwner<byte> Rent(int minBufferSize = -1)
    {
        ArgumentOutOfRangeException.ThrowIfGreaterThan(minBufferSize, BlockSize);
        lock (_lock)
        {
            if (_count > 0)
            {
                var block = _free[--_count];
                _free[_count] = null!;
                _lowWater = Math.Min(_lowWater, _count);
                return block;
            }

            _lowWater = 0;
        }

        return new Block(this);
    }

    /// <summary>Releases half of the free blocks that no rent needed since the last trim.</summary>
    /// <returns>How many blocks were released.</returns>
    public int Trim()
    {
        lock (_lock)
        {
            // From the bottom: the blocks returned longest ago.
            var released = (Math.Min(_lowWater, _count) + 1) / 2;
            Array.Copy(_free, released, _free, 0, _count - released);
            Array.Clear(_free, _count - released, released);
            _count -= released;
            _lowWater = _count;
            return released;
        }
    }

    protected override void Dispose(bool disposing)
    {
        // Kestrel disposes the pool it was given when a listener stops; the others still use it.
        // Only a pool made for a test is ever really done with, and its timer goes with it.
        if (this != Instance)
        {
            _trim?.Dispose();
        }
    }

    private void Return(Block block)
    {
        lock (_lock)
        {
            if (_count < MaxRetained)
            {
                _free[_count++] = block;
            }
        }
    }

    private sealed class Block(BlockPool pool) : IMemoryOwner<byte>
    {
        // Pinned: OpenSSL and the socket read and write it during native calls, and pinning a
        // movable array per call costs more.
        private readonly byte[] _array = GC.AllocateUninitializedArray<byte>(BlockSize, pinned: true);

        public Memory<byte> Memory => _array;

        public void Dispose() => pool.Return(this);
    }
}
