using System.Net;
using System.Net.Security;
using System.Net.Sockets;
using System.Text;

namespace Tern.Tests.Infrastructure;

/// <summary>
/// An HTTP/1.1 client over TLS that writes requests by hand, for what .NET's HttpClient will not
/// send: a body cut short, bad framing, a body sent while the answer is read.
/// </summary>
public sealed class RawHttps : IAsyncDisposable
{
    private RawHttps(Socket socket, SslStream tls)
    {
        Socket = socket;
        Tls = tls;
    }

    public Socket Socket { get; }

    public SslStream Tls { get; }

    public static async Task<RawHttps> ConnectAsync(int port)
    {
        var socket = new Socket(SocketType.Stream, ProtocolType.Tcp);
        await socket.ConnectAsync(IPAddress.Loopback, port);
        var tls = new SslStream(new NetworkStream(socket, ownsSocket: false), false, (_, _, _, _) => true);
        await tls.AuthenticateAsClientAsync(new SslClientAuthenticationOptions { TargetHost = "localhost", ApplicationProtocols = [SslApplicationProtocol.Http11] });
        return new RawHttps(socket, tls);
    }

    public ValueTask WriteAsync(string ascii, CancellationToken cancellationToken = default) =>
        Tls.WriteAsync(Encoding.ASCII.GetBytes(ascii), cancellationToken);

    public ValueTask WriteAsync(ReadOnlyMemory<byte> bytes, CancellationToken cancellationToken = default) =>
        Tls.WriteAsync(bytes, cancellationToken);

    /// <summary>What the server sends until it ends with <paramref name="end"/> or closes the connection, as Latin-1 text.</summary>
    public async Task<string> ReadUntilAsync(string end, CancellationToken cancellationToken = default)
    {
        var received = new StringBuilder();
        var buffer = new byte[64 * 1024];
        int read;
        while (!received.ToString().EndsWith(end, StringComparison.Ordinal) && (read = await Tls.ReadAsync(buffer, cancellationToken)) > 0)
        {
            received.Append(Encoding.Latin1.GetString(buffer, 0, read));
        }

        return received.ToString();
    }

    public async ValueTask DisposeAsync()
    {
        await Tls.DisposeAsync();
        Socket.Dispose();
    }
}
