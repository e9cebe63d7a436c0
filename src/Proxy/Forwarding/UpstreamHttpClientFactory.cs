using System.Net.Http;
using System.Net.Sockets;
using Tern.Proxy.Configuration;
using Tern.Proxy.Listeners;
using Yarp.ReverseProxy.Forwarder;

namespace Tern.Proxy.Forwarding;

/// <summary>
/// YARP's client factory with Tern's connect timeout, so that an upstream that cannot be reached
/// turns into a fast 502 instead of a request that hangs on SYN retries, with Tern's idle timeout
/// for pooled upstream connections, each (or the cluster's own, its metadata), and with a connect
/// that keeps the last descriptors free.
/// </summary>
/// <remarks>
/// The listeners keep clients out of the last eighth of the open-file limit (<see cref="SocketTransport"/>),
/// but upstream connections could take all of it: 600 HTTP/2 streams to a slow HTTP/1.1 upstream under
/// a limit of 500 files left none, and the runtime then aborted the process ("Out of memory.") when it
/// could not start a thread, and the management listener could not accept a probe. So a new upstream
/// connection is refused, as if the limit itself were met (a 503 naming it), once fewer than half the
/// reserve is free. The check is one getrlimit(), dup() and close() of a descriptor held for it
/// (OpenFiles.OpenProbe, at start), made only when a request needs a new connection; pooled ones are
/// reused without it. It counts the descriptors in use before the connect, not those the connect
/// takes on the way (a host name's resolution), and HTTP/3 upstreams do not pass through it.
/// </remarks>
internal sealed class UpstreamHttpClientFactory(ActiveConfiguration active) : ForwarderHttpClientFactory
{
    // The Tern: settings are start-only (see TernSettings.StartOnlySettings): YARP rebuilds a client
    // only when its cluster changes. A cluster's own timeouts (its metadata) are such a change.
    protected override void ConfigureHandler(ForwarderHttpClientContext context, SocketsHttpHandler handler)
    {
        base.ConfigureHandler(context, handler);
        handler.ConnectTimeout = Duration(context.NewMetadata, ReverseProxyValidator.ConnectTimeoutMetadata) ?? active.Bound.ConnectTimeout;
        handler.PooledConnectionIdleTimeout = Duration(context.NewMetadata, ReverseProxyValidator.PooledConnectionIdleTimeoutMetadata) ?? active.Bound.PooledConnectionIdleTimeout;
        handler.ConnectCallback = ConnectAsync;
        handler.RequestHeaderEncodingSelector = HeaderBytes.Upstream;
    }

    // YARP reuses a cluster's client when its HttpClient section is unchanged, whatever its metadata.
    protected override bool CanReuseOldClient(ForwarderHttpClientContext context) =>
        base.CanReuseOldClient(context)
        && ReverseProxyValidator.DurationMetadata.All(key => Duration(context.OldMetadata, key) == Duration(context.NewMetadata, key));

    /// <summary>A cluster's duration under key (Tern.ConnectTimeout, ...; checked by ReverseProxyValidator), or null.</summary>
    internal static TimeSpan? Duration(IReadOnlyDictionary<string, string>? metadata, string key) =>
        metadata is not null && metadata.TryGetValue(key, out var text) && SettingReader.ParseDuration(text) is { Problem: null } duration
            ? duration.Value
            : null;

    /// <summary>What SocketsHttpHandler does without a callback, after the descriptor check.</summary>
    internal static async ValueTask<Stream> ConnectAsync(SocketsHttpConnectionContext context, CancellationToken cancellationToken)
    {
        // The limit is read each time (getrlimit): an operator may change it (prlimit).
        var (floor, limit) = OpenFiles.Reserve.UpstreamFloor();
        if (OpenFiles.LowestFree() >= floor)
        {
            throw new ReserveException(floor, limit);
        }

        var socket = new Socket(SocketType.Stream, ProtocolType.Tcp) { NoDelay = true };
        try
        {
            await socket.ConnectAsync(context.DnsEndPoint, cancellationToken).ConfigureAwait(false);
            return new NetworkStream(socket, ownsSocket: true);
        }
        catch
        {
            socket.Dispose();
            throw;
        }
    }

    /// <summary>
    /// A new upstream connection refused because it would take the last half of the reserve: the
    /// same error as the limit itself (a 503, not counted against the destination), with a message
    /// that says which.
    /// </summary>
    internal sealed class ReserveException(int floor, int limit) : SocketException((int)SocketError.TooManyOpenSockets,
        $"fewer than {limit - floor} of Tern's {limit} descriptors (RLIMIT_NOFILE) were free, which it keeps for its own threads and files and the management listener, not for upstream connections");
}
