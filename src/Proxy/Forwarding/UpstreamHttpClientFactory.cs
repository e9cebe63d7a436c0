using System.Net.Http;
using Tern.Proxy.Configuration;
using Yarp.ReverseProxy.Forwarder;

namespace Tern.Proxy.Forwarding;

/// <summary>
/// YARP's client factory with Tern's connect timeout, so that an upstream that cannot be reached
/// turns into a fast 502 instead of a request that hangs on SYN retries.
/// </summary>
internal sealed class UpstreamHttpClientFactory(ActiveConfiguration active) : ForwarderHttpClientFactory
{
    // Start-only (see TernSettings.StartOnlySettings): YARP rebuilds a client only when its cluster changes.
    protected override void ConfigureHandler(ForwarderHttpClientContext context, SocketsHttpHandler handler)
    {
        base.ConfigureHandler(context, handler);
        handler.ConnectTimeout = active.Bound.ConnectTimeout;
    }
}
