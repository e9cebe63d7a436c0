using System.Buffers;
using Microsoft.AspNetCore.Connections;

namespace Tern.Proxy.Listeners;

/// <summary>
/// The memory behind every connection's pipes: pinned 32 KB blocks, room for two full TLS records.
/// Kestrel's socket transport takes it in place of its own pool of 4 KB blocks (Tern registers it
/// as the <see cref="IMemoryPoolFactory{T}"/>), so a socket read takes up to 32 KB instead of 4 KB;
/// the OpenSSL engine decrypts whole records into one block and writes each into at most two, and
/// Kestrel writes responses into its own pipe's blocks, which the engine turns into records of up to
/// 16 KB. Each socket read is a 1-byte peek and a read (Kestrel waits for data before it takes a
/// block), and a request body reaches the upstream in about one write per block (YARP writes what
/// each read of the body returns), so the block size sets how many system calls a large body
/// costs. A 1 MB upload: 4 KB blocks, 517 reads and 1.3-1.4x the CPU of 16 KB ones; 16 KB blocks,
/// 131 reads and 65 upstream writes; 32 KB blocks, 69 and 35, and 0.78x the CPU of 16 KB ones,
/// while 64 KB ones cost 1.15x what 32 KB ones do (loadtest/README.md, "16 KB blocks under every
/// socket" and "32 KB blocks").
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
    public const int BlockSize = 32 * 1024;

    /// <summary>64 MB of free blocks at most.</summary>
    public const int MaxRetained = 64 * 1024 * 1024 / BlockSize;

    public static readonly TimeSpan TrimInterval = TimeSpan.FromSeconds(10);

    // Free blocks: one stack per core (up to 64), each under its own lock, the block returned last
    // on top. A rent takes from its own core's stack first, so it gets the block most likely still
    // in that core's caches (a single queue handed out the one returned longest ago, the coldest),
    // and cores do not contend for one lock; with nothing there, it takes from the other cores'.
    private readonly FreeBlocks[] _stacks;
    private readonly Timer? _trim;

    /// <param name="trimEvery">How often unused free blocks are released; infinite for none (tests call <see cref="Trim"/>).</param>
    /// <param name="stacks">How many stacks of free blocks; by default one per core, at most 64.</param>
    internal BlockPool(TimeSpan trimEvery, int stacks = 0)
    {
        var count = stacks > 0 ? stacks : Math.Clamp(Environment.ProcessorCount, 1, 64);
        _stacks = new FreeBlocks[count];
        for (var i = 0; i < count; i++)
        {
            _stacks[i] = new FreeBlocks((MaxRetained / count) + (i < MaxRetained % count ? 1 : 0));
        }

        if (trimEvery != Timeout.InfiniteTimeSpan)
        {
            _trim = new Timer(static pool => ((BlockPool)pool!).Trim(), this, trimEvery, trimEvery);
        }
    }

    /// <summary>The process's pool, shared by every listener and connection.</summary>
    public static BlockPool Instance { get; } = new(TrimInterval);

    public override int MaxBufferSize => BlockSize;

    /// <summary>Free blocks held for reuse.</summary>
    public int Retained
    {
        get
        {
            var retained = 0;
            foreach (var stack in _stacks)
            {
                retained += stack.Count;
            }

            return retained;
        }
    }

    /// <summary>Kestrel asks once per listener; every listener shares the one pool.</summary>
    public MemoryPool<byte> Create(MemoryPoolOptions? options = null) => this;

    public override IMemoryOwner<byte> Rent(int minBufferSize = -1)
    {
        ArgumentOutOfRangeException.ThrowIfGreaterThan(minBufferSize, BlockSize);
        var home = Home();
        for (var i = 0; i < _stacks.Length; i++)
        {
            if (_stacks[(home + i) % _stacks.Length].TryPop() is { } block)
            {
                return block;
            }
        }

        return new Block(this);
    }

    /// <summary>Releases half of the free blocks that no rent needed since the last trim.</summary>
    /// <returns>How many blocks were released.</returns>
    public int Trim()
    {
        var released = 0;
        foreach (var stack in _stacks)
        {
            released += stack.Trim();
        }

        return released;
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
        // On this core's stack, else on another's with room; with every stack full (64 MB of free
        // blocks) the block is left to the collector.
        var home = Home();
        for (var i = 0; i < _stacks.Length && !_stacks[(home + i) % _stacks.Length].TryPush(block); i++)
        {
        }
    }

    private int Home() => _stacks.Length == 1 ? 0 : Thread.GetCurrentProcessorId() % _stacks.Length;

    private sealed class FreeBlocks(int capacity)
    {
        private readonly Block[] _blocks = new Block[capacity];
        private readonly Lock _lock = new();
        private int _count;

        // The fewest free blocks seen since the last trim: that many were not needed all interval.
        private int _lowWater;

        public int Count => Volatile.Read(ref _count);

        public Block? TryPop()
        {
            lock (_lock)
            {
                if (_count == 0)
                {
                    _lowWater = 0;
                    return null;
                }

                var block = _blocks[--_count];
                _blocks[_count] = null!;
                _lowWater = Math.Min(_lowWater, _count);
                return block;
            }
        }

        public bool TryPush(Block block)
        {
            lock (_lock)
            {
                if (_count == _blocks.Length)
                {
                    return false;
                }

                _blocks[_count++] = block;
                return true;
            }
        }

        /// <summary>Releases half of the blocks no rent needed since the last trim, from the bottom: those returned longest ago.</summary>
        public int Trim()
        {
            lock (_lock)
            {
                var released = (Math.Min(_lowWater, _count) + 1) / 2;
                Array.Copy(_blocks, released, _blocks, 0, _count - released);
                Array.Clear(_blocks, _count - released, released);
                _count -= released;
                _lowWater = _count;
                return released;
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
