using System.Runtime.InteropServices;

namespace Tern.Proxy.Listeners;

/// <summary>
/// The process's open-file limit and how close Tern is to it, read without opening a file: the
/// listeners' reserve (<see cref="SocketTransport"/>), the upstream connections' share of it
/// (UpstreamHttpClientFactory) and the check at start (TernHost) use it.
/// </summary>
internal static partial class OpenFiles
{
    /// <summary>
    /// The least limit Tern starts with. Tern itself holds about 230-250 descriptors once it serves (its
    /// assemblies, the runtime's pipes and event loops, its listeners), and keeps at least 64 more in
    /// reserve; below this, start-up failed on a file or assembly it could not open, with a stack trace.
    /// </summary>
    public const int Minimum = 400;

    /// <summary>The process's limit on open files (RLIMIT_NOFILE); null if it cannot be read.</summary>
    public static ulong? Limit()
    {
        try
        {
            return GetRLimit(RLimitNoFile, out var limit) == 0 ? limit.Current : null;
        }
        catch (Exception ex) when (ex is DllNotFoundException or EntryPointNotFoundException)
        {
            return null;
        }
    }

    // A descriptor of Tern's own to duplicate, opened at start while descriptors are free: /dev/null,
    // opened by open(2) itself (File.OpenHandle would also take a shared flock on it).
    private static int s_probe = -1;

    /// <summary>Opens the descriptor <see cref="LowestFree()"/> duplicates, once; false if it cannot.</summary>
    public static bool OpenProbe()
    {
        if (Volatile.Read(ref s_probe) >= 0)
        {
            return true;
        }

        try
        {
            var descriptor = Open("/dev/null", OpenReadOnly | OpenCloseOnExec);
            if (descriptor < 0)
            {
                return false;
            }

            if (Interlocked.CompareExchange(ref s_probe, descriptor, -1) != -1)
            {
                _ = Close(descriptor);
            }

            return true;
        }
        catch (Exception ex) when (ex is DllNotFoundException or EntryPointNotFoundException)
        {
            return false;
        }
    }

    /// <summary>The lowest descriptor number free now; 0 (nothing known) if <see cref="OpenProbe"/> did not succeed.</summary>
    public static int LowestFree()
    {
        var probe = Volatile.Read(ref s_probe);
        return probe >= 0 ? LowestFree(probe) : 0;
    }

    /// <summary>The lowest descriptor number free now, found by duplicating <paramref name="open"/>, an open one; int.MaxValue if none is.</summary>
    public static int LowestFree(int open)
    {
        try
        {
            var probe = Dup(open);
            if (probe < 0)
            {
                return int.MaxValue;
            }

            _ = Close(probe);
            return probe;
        }
        catch (Exception ex) when (ex is DllNotFoundException or EntryPointNotFoundException)
        {
            return 0;
        }
    }

    private const int RLimitNoFile = 7; // Linux, every architecture .NET runs on

    [StructLayout(LayoutKind.Sequential)]
    private struct RLimit
    {
        public ulong Current;
        public ulong Maximum;
    }

    [LibraryImport("libc", EntryPoint = "getrlimit")]
    private static partial int GetRLimit(int resource, out RLimit limit);

    private const int OpenReadOnly = 0;
    private const int OpenCloseOnExec = 0x80000; // O_CLOEXEC on Linux, x64 and arm64 alike

    [LibraryImport("libc", EntryPoint = "open", StringMarshalling = StringMarshalling.Utf8)]
    private static partial int Open(string path, int flags);

    [LibraryImport("libc", EntryPoint = "dup")]
    private static partial int Dup(int descriptor);

    [LibraryImport("libc", EntryPoint = "close")]
    private static partial int Close(int descriptor);

    /// <summary>
    /// The descriptors clients may not take: the top eighth of the open-file limit, at least 64.
    /// Descriptors are numbered from 0 and each new one gets the lowest number free, so a client
    /// socket numbered at or above <see cref="Floor"/> means fewer than <see cref="Size"/> are left.
    /// Upstream connections may take the lower half of the reserve, up to <see cref="UpstreamFloor"/>
    /// (UpstreamHttpClientFactory); the upper half is kept for the runtime's threads, files and the
    /// management listener.
    /// </summary>
    internal sealed class Reserve
    {
        public int Limit { get; private set; } = int.MaxValue;

        public int Size { get; private set; }

        public int Floor { get; private set; } = int.MaxValue;

        /// <summary>The lowest descriptor a new upstream connection may not take, and the limit, read now.</summary>
        public static (int Floor, int Limit) UpstreamFloor()
        {
            var limit = CurrentLimit();
            return (limit - (SizeOf(limit) / 2), limit);
        }

        /// <summary>Reads the limit again (an operator may change it with prlimit).</summary>
        public void Refresh()
        {
            var limit = CurrentLimit();
            Size = SizeOf(limit);
            Floor = limit - Size;
            Limit = limit;
        }

        private static int CurrentLimit() => (int)Math.Min(OpenFiles.Limit() ?? int.MaxValue, int.MaxValue);

        private static int SizeOf(int limit) => Math.Max(64, limit / 8);
    }
}
