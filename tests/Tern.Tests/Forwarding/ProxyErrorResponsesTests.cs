using System.Net.Sockets;
using Tern.Proxy.Forwarding;
using Yarp.ReverseProxy.Forwarder;

namespace Tern.Tests.Forwarding;

public sealed class ProxyErrorResponsesTests
{
    [Theory]
    [InlineData(SocketError.TooManyOpenSockets, 503, "Tern has as many connections open as its open-file limit allows; try again later (cluster 'app')")]
    [InlineData(SocketError.ConnectionRefused, 502, "the upstream refused the connection (cluster 'app')")]
    public void ConnectFailure_AtTernsFileLimitIsTernsOwn_OtherwiseTheUpstreams(SocketError error, int status, string reason)
    {
        // What .NET's HTTP client throws when it cannot open the upstream socket (EMFILE and ENFILE
        // are TooManyOpenSockets, seen in OpenFileLimitTests' first version) or the upstream refuses it.
        var failure = new HttpRequestException("connect failed", new SocketException((int)error));

        Assert.Equal((status, reason), ProxyErrorResponses.Describe(ForwarderError.Request, failure, "app"));
    }
}
