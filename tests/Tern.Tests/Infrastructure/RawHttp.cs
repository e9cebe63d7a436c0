using System.Net;
using System.Net.Security;
using System.Net.Sockets;
using System.Text;

namespace Tern.Tests.Infrastructure;

/// <summary>
/// An HTTP/1.1 client, over TLS or not, that writes requests by hand, for what .NET's HttpClient
/// will not send: a body cut short, bad framing, a body sent while the answer is read.
/// </summary>
public sealed class RawHttp : IAsyncDisposable
{
    private RawHttp(Socket socket, Stream stream)
    {
        Socket = socket;
        Stream = stream;
    }

    public Socket Socket { get; }

    /// <summary>The connection's stream: TLS (an SslStream) or the socket's own.</summary>
    public Stream Stream { get; }

    /// <param name="port">A listener on 127.0.0.1.</param>
    /// <param name="tls">Whether to speak TLS first.</param>
    /// <param name="http2">Offer h2 by ALPN instead of http/1.1.</param>
    public static async Task<RawHttp> ConnectAsync(int port, bool tls = true, bool http2 = false)
    {
        var socket = new Socket(SocketType.Stream, ProtocolType.Tcp);
        await socket.ConnectAsync(IPAddress.Loopback, port);
        Stream stream = new NetworkStream(socket, ownsSocket: false);
        if (tls)
        {
            var ssl = new SslStream(stream, false, (_, _, _, _) => true);
            await ssl.AuthenticateAsClientAsync(new SslClientAuthenticationOptions { TargetHost = "localhost", ApplicationProtocols = [http2 ? SslApplicationProtocol.Http2 : SslApplicationProtocol.Http11] });
            stream = ssl;
        }

        return new RawHttp(socket, stream);
    }

    public ValueTask WriteAsync(string ascii, CancellationToken cancellationToken = default) =>
        Stream.WriteAsync(Encoding.ASCII.GetBytes(ascii), cancellationToken);

    public ValueTask WriteAsync(ReadOnlyMemory<byte> bytes, CancellationToken cancellationToken = default) =>
        Stream.WriteAsync(bytes, cancellationToken);

    /// <summary>What the server sends until it ends with <paramref name="end"/> or closes the connection, as Latin-1 text.</summary>
    public async Task<string> ReadUntilAsync(string end, CancellationToken cancellationToken = default)
    {
        var received = new StringBuilder();
        var buffer = new byte[64 * 1024];
        int read;
        while (!received.ToString().EndsWith(end, StringComparison.Ordinal) && (read = await Stream.ReadAsync(buffer, cancellationToken)) > 0)
        {
            received.Append(Encoding.Latin1.GetString(buffer, 0, read));
        }

        return received.ToString();
    }

    public async ValueTask DisposeAsync()
    {
        await Stream.DisposeAsync();
        Socket.Dispose();
    }
}
