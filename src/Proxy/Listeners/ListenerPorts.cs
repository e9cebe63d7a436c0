using System.Net;
using System.Net.Sockets;
using Tern.Proxy.Configuration;

namespace Tern.Proxy.Listeners;

/// <summary>
/// Checks before start-up that every listener's port can be bound, naming the key of each one that
/// cannot, and finds the ports that outgoing connections can take from Tern.
/// </summary>
internal static class ListenerPorts
{
    private const string RangeFile = "/proc/sys/net/ipv4/ip_local_port_range";
    private const string ReservedFile = "/proc/sys/net/ipv4/ip_local_reserved_ports";

    public static IEnumerable<ConfigurationProblem> FindBusy(TernSettings settings)
    {
        foreach (var (key, port) in settings.ListenerPorts())
        {
            var address = key == "Tern:Demo:Port" ? IPAddress.Loopback : IPAddress.IPv6Any;
            var error = TryBind(address, port);
            if (error == SocketError.AddressFamilyNotSupported)
            {
                error = TryBind(IPAddress.Any, port);
            }

            if (error is SocketError.AddressAlreadyInUse)
            {
                yield return new(key, $"port {port} is already in use by another process{EphemeralHint(port)}");
            }
            else if (error is SocketError.AccessDenied)
            {
                yield return new(key, $"port {port} needs privileges this process lacks; use a port above 1023");
            }
        }
    }

    /// <summary>
    /// The listeners whose port lies in the kernel's ephemeral range (net.ipv4.ip_local_port_range)
    /// and is not reserved (net.ipv4.ip_local_reserved_ports): the kernel gives such a port to any
    /// outgoing connection in Tern's network namespace (the machine's, or the pod's), Tern's own to
    /// its upstreams included, and while one holds it Tern cannot bind it at its next start. With
    /// the range, for the warning.
    /// </summary>
    public static IEnumerable<(string Key, int Port, int First, int Last)> InEphemeralRange(TernSettings settings)
    {
        foreach (var (key, port) in settings.ListenerPorts())
        {
            if (Ephemeral(port) is var (first, last))
            {
                yield return (key, port, first, last);
            }
        }
    }

    /// <summary>What to add to a "port in use" error when the port is an ephemeral one: "" or "; it lies in ...".</summary>
    public static string EphemeralHint(int port) => Ephemeral(port) is var (first, last)
        ? $"; it lies in the kernel's ephemeral range {first}-{last}, where an outgoing connection may hold it: {EphemeralAdvice(first)}"
        : "";

    public static string EphemeralAdvice(int first) =>
        $"use a port below {first}, or reserve this one in net.ipv4.ip_local_reserved_ports";

    /// <summary>The ephemeral range if port lies in it and is not reserved; null otherwise, or off Linux.</summary>
    private static (int First, int Last)? Ephemeral(int port)
    {
        var range = ReadProc(RangeFile).Split((char[])['\t', ' '], StringSplitOptions.RemoveEmptyEntries);
        if (range is not [var a, var b] || !int.TryParse(a, out var first) || !int.TryParse(b, out var last)
            || port < first || port > last)
        {
            return null;
        }

        // A list such as "8080,9000-9100".
        foreach (var reserved in ReadProc(ReservedFile).Split(',', StringSplitOptions.RemoveEmptyEntries | StringSplitOptions.TrimEntries))
        {
            var ends = reserved.Split('-');
            if (int.TryParse(ends[0], out var low) && int.TryParse(ends[^1], out var high) && port >= low && port <= high)
            {
                return null;
            }
        }

        return (first, last);
    }

    private static string ReadProc(string path)
    {
        try
        {
            return File.ReadAllText(path).Trim();
        }
        catch (Exception ex) when (ex is IOException or UnauthorizedAccessException)
        {
            return ""; // not Linux, or /proc not mounted
        }
    }

    private static SocketError TryBind(IPAddress address, int port)
    {
        try
        {
            using var socket = new Socket(address.AddressFamily, SocketType.Stream, ProtocolType.Tcp);
            if (address.AddressFamily == AddressFamily.InterNetworkV6)
            {
                socket.DualMode = true;
            }

            // As Kestrel does: connections of a previous run in TIME_WAIT must not count as "in use".
            socket.SetSocketOption(SocketOptionLevel.Socket, SocketOptionName.ReuseAddress, true);
            socket.Bind(new IPEndPoint(address, port));
            socket.Listen();
            return SocketError.Success;
        }
        catch (SocketException ex)
        {
            return ex.SocketErrorCode;
        }
    }
}
