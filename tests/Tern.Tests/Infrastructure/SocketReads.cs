using System.Net.Sockets;

namespace Tern.Tests.Infrastructure;

/// <summary>Raw-socket reads for tests that speak below TLS.</summary>
public static class SocketReads
{
    /// <summary>Everything the server sends until it closes the connection (a reset counts as a close), within timeout.</summary>
    public static async Task<byte[]> UntilClosedAsync(Socket socket, TimeSpan? timeout = null)
    {
        using var limit = new CancellationTokenSource(timeout ?? TimeSpan.FromSeconds(10));
        var received = new MemoryStream();
        var buffer = new byte[4096];
        try
        {
            int read;
            while ((read = await socket.ReceiveAsync(buffer, SocketFlags.None, limit.Token)) > 0)
            {
                received.Write(buffer, 0, read);
            }
        }
        catch (SocketException)
        {
            // Reset instead of closed: gone either way.
        }

        return received.ToArray();
    }
}
