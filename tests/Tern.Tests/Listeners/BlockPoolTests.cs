using System.Buffers;
using System.Runtime.InteropServices;
using Tern.Proxy.Listeners;

namespace Tern.Tests.Listeners;

public sealed class BlockPoolTests : IDisposable
{
    // One stack of free blocks, so that the order of rents does not depend on which core the test
    // thread runs on (BlockPool keeps one per core).
    private readonly BlockPool _pool = new(Timeout.InfiniteTimeSpan, stacks: 1);

    public void Dispose() => _pool.Dispose();

    [Fact]
    public void Rent_GivesThirtyTwoKilobyteBlocks_AndReusesReturnedOnes()
    {
        var first = _pool.Rent();
        Assert.Equal(32 * 1024, first.Memory.Length);
        Assert.True(MemoryMarshal.TryGetArray<byte>(first.Memory, out var array));
        first.Dispose();
        Assert.Equal(1, _pool.Retained);

        using var second = _pool.Rent(4096);
        Assert.True(MemoryMarshal.TryGetArray<byte>(second.Memory, out var again));
        Assert.Same(array.Array, again.Array);
        Assert.Equal(0, _pool.Retained);
    }

    [Fact]
    public void Rent_LargerThanABlock_IsRefused()
    {
        // Pipes ask their pool only for what it says it can give (MaxBufferSize) and take larger
        // sizes from the array pool; anything else asking for more is a bug to surface.
        Assert.Throws<ArgumentOutOfRangeException>(() => _pool.Rent(BlockPool.BlockSize + 1));
    }

    [Fact]
    public void Return_BeyondTheRetentionLimit_LeavesTheBlockToTheCollector()
    {
        Assert.Equal(64 * 1024 * 1024, BlockPool.MaxRetained * BlockPool.BlockSize);
        var blocks = Enumerable.Range(0, BlockPool.MaxRetained + 3).Select(_ => _pool.Rent()).ToList();
        blocks.ForEach(b => b.Dispose());
        Assert.Equal(BlockPool.MaxRetained, _pool.Retained);
    }

    [Fact]
    public void Trim_ReleasesHalfOfTheFreeBlocksNoRentNeededSinceTheLastTrim()
    {
        Return(Rent(10));
        Assert.Equal(10, _pool.Retained);

        // Nothing is known yet about what the last interval needed: a burst's blocks stay.
        Assert.Equal(0, _pool.Trim());

        // An interval in which no block was rented: half of them go.
        Assert.Equal(5, _pool.Trim());
        Assert.Equal(5, _pool.Retained);

        // Three were needed at once: of the two never touched, one goes.
        Return(Rent(3));
        Assert.Equal(1, _pool.Trim());
        Assert.Equal(4, _pool.Retained);

        // An interval that needed more than the pool held releases nothing.
        Return(Rent(6));
        Assert.Equal(0, _pool.Trim());
        Assert.Equal(6, _pool.Retained);
    }

    /// <summary>
    /// The block returned last is rented first, as it is the one most likely still in the CPU's
    /// caches; a trim lets go of those returned longest ago. (Handing out the block returned
    /// longest ago, as a queue does, cost 1.16-1.19x the CPU per 1 MB response: loadtest/README.md.)
    /// </summary>
    [Fact]
    public void Rent_TakesTheBlockReturnedLast_AndTrimReleasesTheOldest()
    {
        var blocks = Rent(4);
        var arrays = blocks.Select(Array).ToList();
        Return(blocks); // returned in order 0, 1, 2, 3

        var again = _pool.Rent();
        Assert.Same(arrays[3], Array(again));
        again.Dispose();

        // Nothing was needed all interval (after the first trim, which knows nothing yet): the two
        // returned longest ago go, and the two returned last are the next rents, newest first.
        _pool.Trim();
        Assert.Equal(2, _pool.Trim());
        var kept = Rent(2);
        Assert.Equal([arrays[3], arrays[2]], kept.Select(Array));
        Return(kept);
    }

    /// <summary>
    /// With a stack per core, a rent finds blocks returned on any core, and blocks returned beyond
    /// one core's share go to the others' stacks, up to the pool's limit.
    /// </summary>
    [Fact]
    public void Stacks_PerCore_ShareTheirBlocks_UpToThePoolsLimit()
    {
        using var pool = new BlockPool(Timeout.InfiniteTimeSpan, stacks: 4);
        var first = Enumerable.Range(0, 10).Select(_ => pool.Rent()).ToList();
        var arrays = first.Select(Array).ToHashSet();
        first.ForEach(b => b.Dispose());
        Assert.Equal(10, pool.Retained);

        var again = Enumerable.Range(0, 10).Select(_ => pool.Rent()).ToList();
        Assert.All(again, b => Assert.Contains(Array(b), arrays));
        Assert.Equal(0, pool.Retained);
        again.ForEach(b => b.Dispose());

        var many = Enumerable.Range(0, BlockPool.MaxRetained + 5).Select(_ => pool.Rent()).ToList();
        many.ForEach(b => b.Dispose());
        Assert.Equal(BlockPool.MaxRetained, pool.Retained);
    }

    /// <summary>The pinned array behind a block.</summary>
    private static byte[] Array(IMemoryOwner<byte> block) => MemoryMarshal.TryGetArray<byte>(block.Memory, out var segment) ? segment.Array! : throw new InvalidOperationException("a block not backed by an array");

    private List<IMemoryOwner<byte>> Rent(int count) => Enumerable.Range(0, count).Select(_ => _pool.Rent()).ToList();

    private static void Return(List<IMemoryOwner<byte>> blocks) => blocks.ForEach(b => b.Dispose());
}
