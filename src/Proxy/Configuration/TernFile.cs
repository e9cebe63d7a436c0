using System.Runtime.InteropServices;

namespace Tern.Proxy.Configuration;

/// <summary>
/// The one rule for the files an operator points Tern at (settings, certificates, keys, CA bundles,
/// ticket keys): a regular file, or a link to one, of at most <see cref="MaxBytes"/>. A path to a
/// FIFO or a device would otherwise hang Tern's start, or its file poll and with it every later
/// reload, in open() or read() (`/dev/zero` never ends); a huge file would be read whole, and
/// hashed every second. Such a path gets "cannot read" naming its setting instead, as a missing
/// file does.
/// </summary>
internal static partial class TernFile
{
    /// <summary>Far above any real settings file, certificate chain or CA bundle (a system bundle is about 200 KB).</summary>
    public const int MaxBytes = 4 << 20;

    /// <summary>Why path is not a file Tern reads, or null when it is (or does not exist: the caller's open says so).</summary>
    public static string? Refusal(string path)
    {
        if (path.Contains('\0', StringComparison.Ordinal))
        {
            return "the path holds a NUL character, which no file name can"; // .NET's file calls throw ArgumentException
        }

        if (Stat(path) is not var (type, size))
        {
            return null;
        }

        return type != RegularFile ? $"it is {Describe(type)}, not a regular file"
            : size > MaxBytes ? $"it holds {size:N0} bytes; Tern reads files of at most {MaxBytes:N0} bytes"
            : null;
    }

    /// <summary>Why an existing file cannot be opened for reading (its permissions), or null when it can.</summary>
    public static string? OpenProblem(string path)
    {
        try
        {
            new FileStream(path, FileMode.Open, FileAccess.Read, FileShare.ReadWrite | FileShare.Delete, bufferSize: 0).Dispose();
            return null;
        }
        catch (Exception ex) when (ex is FileNotFoundException or DirectoryNotFoundException)
        {
            return null; // gone since the caller looked: it reports a missing file
        }
        catch (Exception ex) when (ex is IOException or UnauthorizedAccessException)
        {
            return $"cannot be read: {ex.Message}";
        }
    }

    public static byte[] ReadAllBytes(string path)
    {
        if (Refusal(path) is { } refusal)
        {
            throw new IOException(refusal);
        }

        using var stream = new FileStream(path, FileMode.Open, FileAccess.Read, FileShare.ReadWrite | FileShare.Delete, bufferSize: 0);
        using var content = new MemoryStream();
        var chunk = new byte[16 * 1024];
        int read;
        while ((read = stream.Read(chunk)) > 0)
        {
            // Bounded even if the file was swapped or grew after the check, or statx is not there.
            if (content.Length + read > MaxBytes)
            {
                throw new IOException($"it holds more than {MaxBytes:N0} bytes; Tern reads files of at most {MaxBytes:N0} bytes");
            }

            content.Write(chunk, 0, read);
        }

        return content.ToArray();
    }

    public static string ReadAllText(string path)
    {
        using var reader = new StreamReader(new MemoryStream(ReadAllBytes(path)), detectEncodingFromByteOrderMarks: true);
        return reader.ReadToEnd();
    }

    // statx(2), whose layout is the same on every Linux architecture (unlike stat's).
    private const int AtFdCwd = -100;
    private const uint StatxType = 0x1;
    private const uint StatxSize = 0x200;
    private const int StatxBufferSize = 256;
    private const int ModeOffset = 28;  // __u16 stx_mode
    private const int SizeOffset = 40;  // __u64 stx_size
    private const int TypeMask = 0xF000;
    private const int RegularFile = 0x8000;

    [LibraryImport("libc", EntryPoint = "statx", StringMarshalling = StringMarshalling.Utf8)]
    private static unsafe partial int NativeStatx(int dirFd, string path, int flags, uint mask, byte* buffer);

    // Without statx (not Linux; glibc before 2.28, musl before 1.2.5) only the size bound holds.
    private static bool s_noStatx;

    /// <summary>The file's type bits and size, following links; null if it does not exist or statx is not there.</summary>
    private static unsafe (int Type, long Size)? Stat(string path)
    {
        if (s_noStatx)
        {
            return null;
        }

        var buffer = stackalloc byte[StatxBufferSize];
        try
        {
            if (NativeStatx(AtFdCwd, path, 0, StatxType | StatxSize, buffer) != 0)
            {
                return null;
            }
        }
        catch (Exception ex) when (ex is DllNotFoundException or EntryPointNotFoundException)
        {
            s_noStatx = true;
            return null;
        }

        return (*(ushort*)(buffer + ModeOffset) & TypeMask, *(long*)(buffer + SizeOffset));
    }

    private static string Describe(int type) => type switch
    {
        0x1000 => "a FIFO",
        0x2000 => "a character device",
        0x4000 => "a folder",
        0x6000 => "a block device",
        0xC000 => "a socket",
        _ => "a special file",
    };
}
