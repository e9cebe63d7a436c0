using System.Net;
using System.Net.Sockets;

namespace Tern.Tests.Infrastructure;

/// <summary>
/// An upstream on 127.0.0.1 that writes its own bytes, for what a Kestrel upstream would not do
/// (parse strictly and record, send a malformed answer): each connection goes to a handler,
/// which owns it, until the upstream is disposed.
/// </summary>
public sealed class RawUpstream : IDisposable
{
    private readonly TcpListener _listener = new(IPAddress.Loopback, 0);
    private readonly CancellationTokenSource _stop = new();
    private readonly Func<TcpClient, CancellationToken, Task> _serve;

    /// <param name="serve">Serves one connection; the token is cancelled when the upstream is disposed.</param>
    /// <param name="scheme">The scheme of <see cref="Address"/> (https when the handler speaks TLS).</param>
    public RawUpstream(Func<TcpClient, CancellationToken, Task> serve, string scheme = "http")
    {
        _serve = serve;
        _listener.Start();
        Address = $"{scheme}://127.0.0.1:{((IPEndPoint)_listener.LocalEndpoint).Port}/";
        _ = AcceptAsync();
    }

    public string Address { get; }

    public void Dispose()
    {
        _stop.Cancel();
        _listener.Stop();
    }

    private async Task AcceptAsync()
    {
        while (true)
        {
            TcpClient client;
            try
            {
                client = await _listener.AcceptTcpClientAsync(_stop.Token);
            }
            catch (Exception e) when (e is OperationCanceledException or SocketException or ObjectDisposedException)
            {
                return;
            }

            _ = _serve(client, _stop.Token);
        }
    }
}
