using System.Security.Cryptography;
using Microsoft.Extensions.FileProviders;
using Microsoft.Extensions.FileProviders.Physical;
using Microsoft.Extensions.Primitives;

namespace Tern.Proxy.Configuration;

/// <summary>
/// Signals, once, that the content of any of a set of files differs from what it was when the poll
/// began: a file written in place, replaced by a rename, swapped through a symbolic link (a
/// Kubernetes secret or config map), created or deleted. It reads the files once a second and
/// compares their SHA-256; Tern's files are a few kilobytes.
/// </summary>
/// <remarks>
/// Tern used to watch with inotify, through .NET's PhysicalFileProvider, which has three flaws here:
/// it matches events by file name, so a Kubernetes update, which renames a new ..data link over the
/// old one, went unseen (dotnet/runtime#36091; the Helm chart had to turn on .NET's own 4 s mtime
/// polling); it watches the file's whole folder and its subfolders, so every write to any file
/// there, a log beside the settings say, woke Tern and cost it 2-3 µs (loadtest/README.md,
/// 2026-11-25); and every file provider took one of the user's inotify instances (128 by default,
/// shared by every process of that user on the node; Tern held 4). Polling costs nothing per
/// write, sees every kind of change on any filesystem, and sees it within a second.
/// </remarks>
internal sealed class FilePoll : IDisposable
{
    public static readonly TimeSpan Interval = TimeSpan.FromSeconds(1);

    // One thread polls for the whole process, and only while there is something to poll. A
    // PeriodicTimer per poll woke the thread pool at every tick: an idle Tern switched context
    // 54 times a second and used 3.0 ms of CPU a second; with this thread, 7-9 and 1.9-2.1 (with
    // inotify, 6-8 and 1.6-1.8).
    private static readonly List<FilePoll> s_active = [];
    private static bool s_polling;

    // A fingerprint: a file's SHA-256 (32 bytes), or one of these.
    private static readonly byte[] s_missing = [0];
    private static readonly byte[] s_unreadable = [];

    private readonly (string Path, byte[] Seen)[] _files;
    private readonly CancellationTokenSource _changed = new();
    private readonly Action<Exception>? _failed;

    /// <param name="paths">The files.</param>
    /// <param name="since">
    /// An earlier poll whose recorded content to start from for the files the two share, so that a
    /// change made between that poll's start and this one's is not lost.
    /// </param>
    /// <param name="failed">Told what a listener threw (none: the exception is dropped).</param>
    public FilePoll(IEnumerable<string> paths, FilePoll? since = null, Action<Exception>? failed = null)
    {
        _failed = failed;
        _files = paths.Select(p => (Path: p, Seen: since?.SeenFor(p) ?? Fingerprint(p) ?? s_unreadable)).ToArray();
        Token = new CancellationChangeToken(_changed.Token);
        if (_files.Length == 0)
        {
            return; // nothing can change
        }

        lock (s_active)
        {
            s_active.Add(this);
            if (!s_polling)
            {
                s_polling = true;
                new Thread(Run) { IsBackground = true, Name = "Tern file poll" }.UnsafeStart();
            }
        }
    }

    /// <summary>Fires once, on the thread pool, on the first change seen.</summary>
    public IChangeToken Token { get; }

    private byte[]? SeenFor(string path)
    {
        foreach (var (p, seen) in _files)
        {
            if (p == path)
            {
                return seen;
            }
        }

        return null;
    }

    public void Dispose()
    {
        lock (s_active)
        {
            s_active.Remove(this);
        }
    }

    private static void Run()
    {
        while (true)
        {
            Thread.Sleep(Interval);
            FilePoll[] polls;
            lock (s_active)
            {
                if (s_active.Count == 0)
                {
                    s_polling = false;
                    return;
                }

                polls = [.. s_active];
            }

            foreach (var poll in polls.Where(p => p._files.Any(f => Fingerprint(f.Path) is { } now && !SameContent(f.Seen, now))))
            {
                lock (s_active)
                {
                    if (!s_active.Remove(poll))
                    {
                        continue; // disposed meanwhile: its owner no longer listens
                    }
                }

                ThreadPool.UnsafeQueueUserWorkItem(static p => p.Fire(), poll, preferLocal: false);
            }
        }
    }

    /// <summary>
    /// Tells the listeners. Every listener runs even if one throws, and an exception must not end
    /// the process from the thread pool: it goes to the failure sink. The configuration system's
    /// listeners can throw: its JSON provider when the file cannot be opened, .NET's logging when
    /// an option of its own does not parse.
    /// </summary>
    private void Fire()
    {
        try
        {
            _changed.Cancel();
        }
        catch (AggregateException ex)
        {
            foreach (var inner in ex.Flatten().InnerExceptions)
            {
                _failed?.Invoke(inner);
            }
        }
    }

    private static bool SameContent(byte[] a, byte[] b) => a.AsSpan().SequenceEqual(b);

    /// <summary>The file's SHA-256, or s_missing, or s_unreadable; null when it cannot be told now.</summary>
    private static byte[]? Fingerprint(string path)
    {
        if (!File.Exists(path))
        {
            return s_missing;
        }

        if (TernFile.Refusal(path) is not null)
        {
            return s_unreadable; // a FIFO or device would block this thread, and every poll with it
        }

        try
        {
            using var stream = new FileStream(path, FileMode.Open, FileAccess.Read, FileShare.ReadWrite | FileShare.Delete, bufferSize: 0);
            return SHA256.HashData(stream);
        }
        catch (Exception ex) when (ex is FileNotFoundException or DirectoryNotFoundException)
        {
            return s_missing; // a dangling link
        }
        catch (IOException ex) when (ex.HResult is TooManyOpenFiles or TooManyOpenFilesInSystem)
        {
            // Tern (or the system) has as many files open as it may: the file has not changed, and
            // taking it for unreadable would reload, fail and reload again once files free up.
            return null;
        }
        catch (Exception ex) when (ex is IOException or UnauthorizedAccessException)
        {
            return s_unreadable;
        }
    }

    // On Linux, .NET reports an errno it has no exception type for as an IOException whose HResult
    // is the errno: EMFILE and ENFILE among them.
    private const int TooManyOpenFiles = 24;
    private const int TooManyOpenFilesInSystem = 23;
}

/// <summary>
/// A folder's files for the configuration system, watched by <see cref="FilePoll"/> instead of
/// inotify. The folder need not exist yet: a file that appears later is seen.
/// </summary>
internal sealed class PolledFolder(string folder) : IFileProvider, IDisposable
{
    private readonly Lock _lock = new();
    private FilePoll? _poll;
    private bool _disposed;

    /// <summary>Told what the configuration system threw when it applied a change (see FilePoll).</summary>
    public Action<Exception>? Failed { get; set; }

    public IFileInfo GetFileInfo(string subpath)
    {
        var file = new FileInfo(Path.Combine(folder, subpath));
        // A FIFO, device or oversized file is not served: the configuration system would block
        // reading it. Nor is one Tern may not open: the configuration system opens it outside its
        // own error handling, and start-up would end in a stack trace. The file's Error says why
        // (CheckedJsonFile).
        return Exists(file) && TernFile.Refusal(file.FullName) is null && TernFile.OpenProblem(file.FullName) is null
            ? new PhysicalFileInfo(file)
            : new NotFoundFileInfo(subpath);
    }

    /// <summary>
    /// Whether file is a file or a link that leads to one. .NET counts a dangling link (a
    /// Kubernetes swap caught half-way) as an existing file, which the configuration system would
    /// then fail to open.
    /// </summary>
    public static bool Exists(FileInfo file)
    {
        try
        {
            return file.Exists && (file.LinkTarget is null || file.ResolveLinkTarget(returnFinalTarget: true)?.Exists == true);
        }
        catch (Exception ex) when (ex is IOException or UnauthorizedAccessException)
        {
            return false; // a loop of links, or a folder on the way that cannot be read
        }
    }

    public IDirectoryContents GetDirectoryContents(string subpath) => NotFoundDirectoryContents.Singleton;

    /// <summary>The configuration asks again after each change; only the newest poll runs.</summary>
    public IChangeToken Watch(string filter)
    {
        lock (_lock)
        {
            if (_disposed)
            {
                return NullChangeToken.Singleton; // asked by a change that fired as the file's provider went
            }

            _poll?.Dispose();
            // Failed as it is when the change fires: it is set after the first watch.
            _poll = new FilePoll([Path.Combine(folder, filter)], failed: ex => Failed?.Invoke(ex));
            return _poll.Token;
        }
    }

    public void Dispose()
    {
        lock (_lock)
        {
            _disposed = true;
            _poll?.Dispose();
        }
    }
}
