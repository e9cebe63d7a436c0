using System.Diagnostics;
using System.Net.Sockets;
using System.Text;
using Tern.Tests.Infrastructure;

namespace Tern.Tests.Forwarding;

/// <summary>
/// Tern:Forwarding:PooledConnectionIdleTimeout: an upstream connection is reused while requests
/// come, and closed by Tern once it has waited unused that long, so that Tern does not hold it (and
/// its descriptor) past the upstream's own keep-alive; a cluster's metadata
/// Tern.PooledConnectionIdleTimeout sets its own. Pooling does not depend on the TLS engine:
/// default engine only.
/// </summary>
public sealed class UpstreamPoolTests
{
    [Fact]
    public async Task IdleUpstreamConnection_IsReusedThenClosedAfterTheIdleTimeout()
    {
        using var upstream = new CountingUpstream();
        var config = new TernConfig(Proxy.Tls.TlsEngines.OpenSsl).Route("all", "app", "{**catch-all}").Cluster("app", [upstream.Address]);
        config.Tern["Forwarding"] = new System.Text.Json.Nodes.JsonObject { ["PooledConnectionIdleTimeout"] = "00:00:01" };
        await using var tern = await TernInstance.StartAsync(config);
        using var client = tern.CreateClient();

        // Two requests one after the other share one upstream connection.
        Assert.Equal("ok 1", await client.GetStringAsync("/a"));
        Assert.Equal("ok 2", await client.GetStringAsync("/b"));
        Assert.Equal(1, upstream.Connections);

        // Left unused, Tern closes it: the upstream reads the end of the connection. .NET's pool looks
        // for idle connections about once a second, so this takes 1-2 s; 15 s leaves room for a loaded
        // machine and still rules out the one-minute default.
        var watch = Stopwatch.StartNew();
        var closed = await upstream.Closed(1).WaitAsync(TimeSpan.FromSeconds(15));
        Assert.Equal(2, closed);
        Assert.True(watch.Elapsed >= TimeSpan.FromSeconds(0.5), $"closed after {watch.Elapsed}, before the idle timeout");

        // The next request opens a new connection.
        Assert.Equal("ok 1", await client.GetStringAsync("/c"));
        Assert.Equal(2, upstream.Connections);
    }

    /// <summary>
    /// A cluster of an upstream with a short keep-alive (gunicorn's 2 s) gets a short idle timeout of
    /// its own, the others keep Tern's; set by a reload, the next request gets a new client.
    /// </summary>
    [Fact]
    public async Task ClustersOwnIdleTimeout_SetByAReload_ClosesItsConnection()
    {
        using var upstream = new CountingUpstream();
        var config = new TernConfig(Proxy.Tls.TlsEngines.OpenSsl).Route("all", "app", "{**catch-all}").Cluster("app", [upstream.Address]);
        await using var tern = await TernInstance.StartAsync(config);
        using var client = tern.CreateClient();
        Assert.Equal("ok 1", await client.GetStringAsync("/a")); // a connection in the pool of the client made at start (Tern's minute)

        ((System.Text.Json.Nodes.JsonObject)config.ReverseProxy["Clusters"]!["app"]!)["Metadata"] = new System.Text.Json.Nodes.JsonObject { ["Tern.PooledConnectionIdleTimeout"] = "00:00:01" };
        await tern.RewriteConfigAsync(config.ToJson());
        await tern.Logs.WaitForAsync("Configuration reloaded");

        // The cluster's new client opens a connection of its own and closes it after a second unused
        // (1-2 s, as above). The first one is the old client's: it waits out its minute, or goes
        // when that client is collected.
        Assert.Equal("ok 1", await client.GetStringAsync("/b"));
        Assert.Equal(2, upstream.Connections);
        var watch = Stopwatch.StartNew();
        Assert.Equal(1, await upstream.Closed(2).WaitAsync(TimeSpan.FromSeconds(15)));
        Assert.True(watch.Elapsed >= TimeSpan.FromSeconds(0.5), $"closed after {watch.Elapsed}, before the idle timeout");
    }

    /// <summary>
    /// An HTTP/1.1 upstream that answers each request on a connection with "ok N" (N counting that
    /// connection's requests), counts connections, and tells when Tern closes each
    /// (<see cref="Closed"/>: the number of requests served on it).
    /// </summary>
    private sealed class CountingUpstream : IDisposable
    {
        private readonly RawUpstream _raw;
        private int _connections;

        public CountingUpstream() => _raw = new RawUpstream(ServeAsync);

        public string Address => _raw.Address;

        public int Connections => Volatile.Read(ref _connections);

        private readonly System.Collections.Concurrent.ConcurrentDictionary<int, TaskCompletionSource<int>> _closed = new();

        /// <summary>The requests served on the connection'th connection (from 1) when Tern closed it; fails if it was reset.</summary>
        public Task<int> Closed(int connection) => Close(connection).Task;

        private TaskCompletionSource<int> Close(int connection) => _closed.GetOrAdd(connection, _ => new(TaskCreationOptions.RunContinuationsAsynchronously));

        public void Dispose() => _raw.Dispose();

        private async Task ServeAsync(TcpClient client, CancellationToken stop)
        {
            using var _ = client;
            var closed = Close(Interlocked.Increment(ref _connections));
            var stream = client.GetStream();
            var buffer = new byte[16 * 1024];
            var head = new StringBuilder();
            var served = 0;
            try
            {
                while (true)
                {
                    var read = await stream.ReadAsync(buffer, stop);
                    if (read == 0)
                    {
                        closed.TrySetResult(served);
                        return;
                    }

                    head.Append(Encoding.ASCII.GetString(buffer, 0, read));
                    while (head.ToString().IndexOf("\r\n\r\n", StringComparison.Ordinal) is var end and >= 0)
                    {
                        head.Remove(0, end + 4); // the requests carry no body
                        var answer = $"ok {++served}";
                        await stream.WriteAsync(Encoding.ASCII.GetBytes($"HTTP/1.1 200 OK\r\nContent-Length: {answer.Length}\r\n\r\n{answer}"), stop);
                    }
                }
            }
            catch (Exception e) when (e is IOException or OperationCanceledException)
            {
                closed.TrySetException(e);
            }
        }
    }
}
