using System.Net;
using System.Net.Sockets;

namespace Tern.Tests.Infrastructure;

/// <summary>Ports for listeners the tests configure by number (Tern's ports are settings, not 0).</summary>
public static class FreePort
{
    private static readonly HashSet<int> s_handedOut = [];

    public static int Next()
    {
        while (true)
        {
            using var listener = new TcpListener(IPAddress.IPv6Any, 0);
            listener.Server.DualMode = true;
            listener.Start();
            var port = ((IPEndPoint)listener.LocalEndpoint).Port;
            lock (s_handedOut)
            {
                if (s_handedOut.Add(port))
                {
                    return port;
                }
            }
        }
    }
}
