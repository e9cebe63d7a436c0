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
/// there, a log beside the settings say, woke Tern and cost it about 2 µs (loadtest/README.md,
/// 2026-11-25); and every watched folder took one of the user's inotify instances (128 by default,
/// shared by every process of that user on the node). Polling costs nothing per write, sees every
/// kind of change on any filesystem, and sees it within a second.
/// </remarks>
internal sealed class FilePoll : IDisposable
{
    public static readonly TimeSpan Interval = TimeSpan.FromSeconds(1);

    // One thread polls for the whole process, and only while there is something to poll: a thread
    // that sleeps wakes once a second, where a timer per poll woke the thread pool several times
    // for each tick (idle Tern: 54 context switches a second instead of 6, twice the idle CPU).
    private static readonly List<FilePoll> s_active = [];
    private static bool s_polling;

    private readonly (string Path, byte[]? Seen)[] _files;
    private readonly CancellationTokenSource _changed = new();

    public FilePoll(IEnumerable<string> paths)
    {
        _files = paths.Select(p => (Path: p, Seen: Fingerprint(p))).ToArray();
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
                new Thread(Run) { IsBackground = true, Name = "Tern file poll" }.Start();
            }
        }
    }

    /// <summary>Fires once, on the thread pool, on the first change seen.</summary>
    public IChangeToken Token { get; }

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

            foreach (var poll in polls.Where(p => p._files.Any(f => !SameContent(f.Seen, Fingerprint(f.Path)))))
            {
                lock (s_active)
                {
                    if (!s_active.Remove(poll))
                    {
                        continue; // disposed meanwhile: its owner no longer listens
                    }
                }

                ThreadPool.UnsafeQueueUserWorkItem(static p => p._changed.Cancel(), poll, preferLocal: false);
            }
        }
    }

    private static bool SameContent(byte[]? a, byte[]? b) => a is null ? b is null : b is not null && a.AsSpan().SequenceEqual(b);

    /// <summary>The file's SHA-256, empty when it cannot be read, null when it does not exist.</summary>
    private static byte[]? Fingerprint(string path)
    {
        if (!File.Exists(path))
        {
            return null;
        }

        try
        {
            using var stream = new FileStream(path, FileMode.Open, FileAccess.Read, FileShare.ReadWrite | FileShare.Delete, bufferSize: 0);
            return SHA256.HashData(stream);
        }
        catch (FileNotFoundException)
        {
            return null;
        }
        catch (Exception ex) when (ex is IOException or UnauthorizedAccessException)
        {
            return [];
        }
    }
}

/// <summary>
/// A folder's files for the configuration system, watched by <see cref="FilePoll"/> instead of
/// inotify. The folder need not exist yet: a file that appears later is seen.
/// </summary>
internal sealed class PolledFolder(string folder) : IFileProvider, IDisposable
{
    private FilePoll? _poll;

    public IFileInfo GetFileInfo(string subpath)
    {
        var path = Path.Combine(folder, subpath);
        return File.Exists(path) ? new PhysicalFileInfo(new FileInfo(path)) : new NotFoundFileInfo(subpath);
    }

    public IDirectoryContents GetDirectoryContents(string subpath) => NotFoundDirectoryContents.Singleton;

    /// <summary>The configuration asks again after each change; only the newest poll runs.</summary>
    public IChangeToken Watch(string filter)
    {
        var poll = new FilePoll([Path.Combine(folder, filter)]);
        Interlocked.Exchange(ref _poll, poll)?.Dispose();
        return poll.Token;
    }

    public void Dispose() => Interlocked.Exchange(ref _poll, null)?.Dispose();
}
