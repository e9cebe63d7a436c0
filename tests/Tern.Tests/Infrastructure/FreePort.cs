using System.Net;
using System.Net.Sockets;

namespace Tern.Tests.Infrastructure;

/// <summary>
/// Ports for listeners the tests configure by number (Tern's ports are settings, not 0). They are
/// taken below the kernel's ephemeral range: a port from that range can be given to an outgoing
/// connection (of any test running in parallel) between the moment it is handed out here and the
/// moment Tern binds it, and Kestrel's bind then fails with "address already in use". Each port
/// handed out is also claimed, for this process's life, by a lock on a file named after it: two test
/// runs at once (a developer's and a review's) would otherwise hand out the same free port, and
/// the second to bind it fails.
/// </summary>
public static class FreePort
{
    private const int Lowest = 20000;
    private static readonly Lock s_lock = new();
    private static readonly int s_end = EphemeralStart();
    private static int s_next = Lowest + (int)((long)Environment.ProcessId * 7919 % Math.Max(1, s_end - Lowest));
    private static readonly string s_claims = Directory.CreateDirectory(Path.Combine(Path.GetTempPath(), $"tern-test-ports-{Environment.UserName}")).FullName;
    private static readonly List<FileStream> s_claimed = [];

    public static int Next()
    {
        lock (s_lock)
        {
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
    /// Whether this process now holds the port's claim (an flock, which the kernel lets go when the
    /// process ends however it ends, so a killed run leaves no claim behind).
    /// </summary>
    private static bool Claim(int port)
    {
        try
        {
            s_claimed.Add(new FileStream(Path.Combine(s_claims, port.ToString(System.Globalization.CultureInfo.InvariantCulture)), FileMode.OpenOrCreate, FileAccess.ReadWrite, FileShare.None));
            return true;
        }
        catch (IOException)
        {
            return false; // another test run's
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
