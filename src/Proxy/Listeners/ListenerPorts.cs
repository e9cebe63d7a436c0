using System.Net;
using System.Net.Sockets;
using Tern.Proxy.Configuration;

namespace Tern.Proxy.Listeners;

/// <summary>Checks before start-up that every listener's port can be bound, naming the key of each one that cannot.</summary>
internal static class ListenerPorts
{
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
                yield return new(key, $"port {port} is already in use by another process");
            }
            else if (error is SocketError.AccessDenied)
            {
                yield return new(key, $"port {port} needs privileges this process lacks; use a port above 1023");
            }
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
