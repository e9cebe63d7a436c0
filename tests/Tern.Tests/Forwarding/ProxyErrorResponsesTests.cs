using System.Net.Sockets;
using Tern.Proxy.Forwarding;
using Yarp.ReverseProxy.Configuration;
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

        Assert.Equal((status, reason), ProxyErrorResponses.Describe(ForwarderError.Request, failure, new ClusterConfig { ClusterId = "app" }));
    }

    [Fact]
    public void RequestBodyFailure_KestrelsOverflowingChunkSizeIsARefusal_AResetIsNot()
    {
        // Kestrel's chunked parser throws this for a chunk size of 2^31 or more, where any other bad
        // chunk size is its BadHttpRequestException; a client that goes away fails the read with a
        // plain IOException (ForwardingTests covers both over real connections).
        var overflow = new IOException("Bad chunk size data.", new OverflowException());

        Assert.Equal((400, "Bad chunk size data."), ProxyErrorResponses.Rejection(new InvalidOperationException("copy failed", overflow)));
        Assert.Null(ProxyErrorResponses.Rejection(new IOException("The client reset the request stream.")));
        Assert.Null(ProxyErrorResponses.Rejection(new IOException("Unable to read data from the transport connection", new SocketException((int)SocketError.ConnectionReset))));
    }

    [Fact]
    public void NewHttp2ConnectionFailsWithNoCategory_OnAClusterThatAllowsOnlyHttp2_IsHttp2sFailure()
    {
        // What .NET throws, now and then, when the upstream answers HTTP/2's preface with HTTP/1.1
        // (UpstreamFailureTests' /h2/x): no HttpRequestError, no inner exception.
        var failure = new HttpRequestException("An HTTP/2 connection could not be established because the server did not complete the HTTP/2 handshake.");
        var http2Only = new ClusterConfig { ClusterId = "h2", HttpRequest = new ForwarderRequestConfig { Version = new Version(2, 0), VersionPolicy = HttpVersionPolicy.RequestVersionExact } };
        var either = new ClusterConfig { ClusterId = "h2", HttpRequest = new ForwarderRequestConfig { Version = new Version(2, 0) } };

        Assert.Equal((502, "HTTP/2 with the upstream failed (cluster 'h2')"), ProxyErrorResponses.Describe(ForwarderError.Request, failure, http2Only));
        Assert.Equal((502, "the request to the upstream failed (cluster 'h2')"), ProxyErrorResponses.Describe(ForwarderError.Request, failure, either));
    }
}
