using System.Diagnostics;
using System.Net;
using System.Net.Sockets;

namespace Tern.Tests.Infrastructure;

/// <summary>
/// Ports for listeners the tests configure by number (Tern's ports are settings, not 0). They are
/// taken below the kernel's ephemeral range: a port from that range can be given to an outgoing
/// connection (of any test running in parallel) between the moment it is handed out here and the
/// moment Tern binds it, and Kestrel's bind then fails with "address already in use". Each port
/// handed out is also claimed for a minute, by a lock on a file named after it: two test runs at
/// once (a developer's and a review's) would otherwise hand out the same free port, and the second
/// to bind it fails. A minute covers the time to bind it; after that, the listener holds it.
/// </summary>
public static class FreePort
{
    private const int Lowest = 20000;

    /// <summary>The errno .NET gives as the HResult where another process holds the file's lock.</summary>
    private const int EWouldBlock = 11;

    private static readonly TimeSpan s_claimFor = TimeSpan.FromMinutes(1);
    private static readonly Lock s_lock = new();
    private static readonly int s_end = EphemeralStart();
    private static int s_next = Lowest + (int)((long)Environment.ProcessId * 7919 % Math.Max(1, s_end - Lowest));
    private static readonly string? s_claims = ClaimFolder();
    private static readonly Queue<(FileStream File, long Since)> s_claimed = new();

    public static int Next()
    {
        lock (s_lock)
        {
            while (s_claimed.TryPeek(out var oldest) && Stopwatch.GetElapsedTime(oldest.Since) > s_claimFor)
            {
                s_claimed.Dequeue().File.Dispose();
            }

            for (var tries = 0; tries < s_end - Lowest; tries++)
            {
                var port = s_next;
                s_next = s_next + 1 >= s_end ? Lowest : s_next + 1;
                if (Claim(port) && CanBind(port))
                {
                    return port;
                }
            }
        }

        throw new InvalidOperationException($"no free port between {Lowest} and {s_end}");
    }

    /// <summary>
    /// Whether no other test run holds the port's claim; this one now does, where claims can be
    /// made at all (an flock, which the kernel lets go when the process ends however it ends, so a
    /// killed run leaves no claim behind). Where they cannot (a folder not this user's, no file
    /// handles left), the bind probe alone decides, as before claims.
    /// </summary>
    private static bool Claim(int port)
    {
        if (s_claims is null)
        {
            return true;
        }

        try
        {
            var file = new FileStream(Path.Combine(s_claims, port.ToString(System.Globalization.CultureInfo.InvariantCulture)), FileMode.OpenOrCreate, FileAccess.ReadWrite, FileShare.None);
            s_claimed.Enqueue((file, Stopwatch.GetTimestamp()));
            return true;
        }
        catch (IOException e) when (e.HResult == EWouldBlock)
        {
            return false; // another test run's
        }
        catch (Exception e) when (e is IOException or UnauthorizedAccessException)
        {
            return true;
        }
    }

    private static string? ClaimFolder()
    {
        try
        {
            return Directory.CreateDirectory(Path.Combine(Path.GetTempPath(), $"tern-test-ports-{Environment.UserName}")).FullName;
        }
        catch (Exception e) when (e is IOException or UnauthorizedAccessException)
        {
            return null;
        }
    }

    private static bool CanBind(int port)
    {
        try
        {
            using var listener = new TcpListener(IPAddress.IPv6Any, port);
            listener.Server.DualMode = true;
            listener.Start();
            return true;
        }
        catch (SocketException)
        {
            return false;
        }
    }

    /// <summary>The first port of net.ipv4.ip_local_port_range (Linux's default is 32768).</summary>
    private static int EphemeralStart()
    {
        try
        {
            var first = File.ReadAllText("/proc/sys/net/ipv4/ip_local_port_range").Split((char[])['\t', ' '], StringSplitOptions.RemoveEmptyEntries)[0];
            var start = int.Parse(first, System.Globalization.CultureInfo.InvariantCulture);
            return start > Lowest + 1000 ? start : 32768;
        }
        catch (IOException)
        {
            return 32768;
        }
    }
}
