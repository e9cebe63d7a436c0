using System.Collections;
using System.Reflection;
using Microsoft.Extensions.Configuration;
using Tern.Proxy.Configuration;
using Tern.Tests.Infrastructure;
using Yarp.ReverseProxy.Configuration;

namespace Tern.Tests.Configuration;

/// <summary>
/// Route and cluster values YARP takes but cannot serve (every request a 500, or sent somewhere
/// else without a word) are problems of their key; keys YARP does not read are named as ignored.
/// Checked through ConfigurationSnapshot.TryLoad, as at start and on every reload.
/// </summary>
public sealed class ReverseProxyChecksTests
{
    private const string Route = "ReverseProxy:Routes:r";
    private const string Cluster = "ReverseProxy:Clusters:c";

    private static Dictionary<string, string?> Base() => new(StringComparer.OrdinalIgnoreCase)
    {
        ["Tern:Tls:Certificates:a:CertificatePath"] = TestPki.ATest.CertificatePath,
        ["Tern:Tls:Certificates:a:KeyPath"] = TestPki.ATest.KeyPath,
        [$"{Route}:ClusterId"] = "c",
        [$"{Route}:Match:Path"] = "/api/{**rest}",
        [$"{Cluster}:Destinations:d1:Address"] = "http://127.0.0.1:1/",
    };

    private static ConfigurationSnapshot? Load(Dictionary<string, string?> values, out IReadOnlyList<ConfigurationProblem> problems) =>
        ConfigurationSnapshot.TryLoad(new ConfigurationBuilder().AddInMemoryCollection(values).Build(), out problems);

    [Theory]
    // Hosts as ASP.NET Core's host matching reads them: what it cannot read was a 500 for every request.
    [InlineData("Routes:r:Match:Hosts:0", "[::1]:8443", "'[::1]:8443': ASP.NET Core's host matching cannot match an IPv6 address")]
    [InlineData("Routes:r:Match:Hosts:0", "::1", "'::1': ASP.NET Core's host matching cannot match an IPv6 address")]
    [InlineData("Routes:r:Match:Hosts:0", "example.com:", "'example.com:': '' is not a port: give 1-65535 or *, or no port")]
    [InlineData("Routes:r:Match:Hosts:0", "example.com:https", "'example.com:https': 'https' is not a port")]
    [InlineData("Routes:r:Match:Hosts:0", ":8443", "':8443': names no host")]
    [InlineData("Routes:r:Match:Hosts:0", "example.com:70000", "'example.com:70000': '70000' is not a port")] // never matched
    [InlineData("Routes:r:Match:Hosts:0", "[v]", "'[v]': ASP.NET Core's host matching cannot match an IPv6 address, nor a host in brackets")] // read as a name no request carries
    [InlineData("Routes:r:Match:Hosts:0", "example.com", null)]
    // A URL or a path where a host goes: no request's Host has a '/'.
    [InlineData("Routes:r:Match:Hosts:0", "https://example.com/app", "'https://example.com/app': a URL, not a host: write the host alone (example.com), and a path in Match:Path")]
    [InlineData("Routes:r:Match:Hosts:0", "example.com/app", "'example.com/app': holds a '/', which no Host header does, so the route would match no request: write the host alone, and a path in Match:Path")]
    // Policies of middleware Tern does not run: the special names failed every request (500) or did nothing.
    [InlineData("Routes:r:AuthorizationPolicy", "Default", "'Default': Tern authenticates no one and has no authorization policies (the upstream checks the credentials Tern passes on); remove it")]
    [InlineData("Routes:r:AuthorizationPolicy", "admins", "'admins': Tern authenticates no one")]
    [InlineData("Routes:r:AuthorizationPolicy", "anonymous", null)]
    [InlineData("Routes:r:CorsPolicy", "Disable", "'Disable': Tern answers no CORS itself (the upstream's CORS headers and its answers to preflight requests pass through); remove it")]
    [InlineData("Routes:r:CorsPolicy", "Default", "'Default': Tern answers no CORS itself")]
    [InlineData("Routes:r:RateLimiterPolicy", "Default", "'Default': Tern limits no request rates and has no rate limiter policies; remove it")]
    [InlineData("Routes:r:RateLimiterPolicy", "Disable", null)]
    [InlineData("Routes:r:TimeoutPolicy", "slow", "'slow': Tern has no timeout policies; remove it and give the route a Timeout (00:00:30, say)")]
    [InlineData("Routes:r:TimeoutPolicy", "Disable", null)]
    // YARP's health policies read these as numbers and took their default without a word where one did not parse; a RateLimit of 0 marked every destination down.
    [InlineData("Clusters:c:Metadata:TransportFailureRateHealthPolicy.RateLimit", "50%", "'50%' is not a failure rate above 0 and at most 1 (YARP's default, 0.3, is 30%)")]
    [InlineData("Clusters:c:Metadata:TransportFailureRateHealthPolicy.RateLimit", "0", "'0' is not a failure rate above 0 and at most 1")]
    [InlineData("Clusters:c:Metadata:TransportFailureRateHealthPolicy.RateLimit", "1.5", "'1.5' is not a failure rate above 0 and at most 1")]
    [InlineData("Clusters:c:Metadata:TransportFailureRateHealthPolicy.RateLimit", "0.5", null)]
    [InlineData("Clusters:c:Metadata:ConsecutiveFailuresHealthPolicy.Threshold", "three", "'three' is not a number of failed probes in a row, 1 or more (YARP's default is 2)")]
    [InlineData("Clusters:c:Metadata:ConsecutiveFailuresHealthPolicy.Threshold", "NaN", "'NaN' is not a number of failed probes in a row")]
    [InlineData("Clusters:c:Metadata:ConsecutiveFailuresHealthPolicy.Threshold", "0", "'0' is not a number of failed probes in a row")]
    [InlineData("Clusters:c:Metadata:ConsecutiveFailuresHealthPolicy.Threshold", "5", null)]
    [InlineData("Clusters:c:Metadata:Team.Owner", "payments", null)] // the operator's own
    [InlineData("Clusters:c:Destinations:d1:Metadata:zone", "eu-1", null)]
    // A header match no request can carry.
    [InlineData("Routes:r:Match:Headers:0:Name", "X Tenant", "'X Tenant' is not a header name (letters, digits and !#$%&'*+-.^_`|~): no request carries it, so the route would match none")]
    [InlineData("Routes:r:Match:Headers:0:Name", "X-Tenant:", "'X-Tenant:' is not a header name")]
    [InlineData("Routes:r:Match:Headers:0:Name", "X-Tenant", null)]
    [InlineData("Routes:r:Match:Hosts:0", "*.example.com:8443", null)]
    [InlineData("Routes:r:Match:Hosts:0", "example.com:*", null)]
    [InlineData("Routes:r:Match:Hosts:0", "*", null)]
    [InlineData("Routes:r:Match:Hosts:0", "example.com:+443", null)] // ASP.NET Core reads it as 443
    // A path written as nginx or Envoy take a prefix, or as a regular expression, matched that text alone.
    [InlineData("Routes:r:Match:Path", "/api/*", "'/api/*' is written as a wildcard, but a route template takes neither: it matches only the path '/api/*' itself; for every path under /api write /api/{**rest}")]
    [InlineData("Routes:r:Match:Path", "/*", "'/*' is written as a wildcard, but a route template takes neither: it matches only the path '/*' itself; for every path under / write /{**rest}")]
    [InlineData("Routes:r:Match:Path", "/api/.*", "'/api/.*' is written as a regular expression, but a route template takes neither")]
    [InlineData("Routes:r:Match:Path", "^/api", "'^/api' is written as a regular expression, but a route template takes neither: it matches only the path '^/api' itself; for every path under /api write /api/{**rest}")]
    [InlineData("Routes:r:Match:Path", "/api/[^/]+", "'/api/[^/]+' is written as a regular expression, but a route template takes neither: it matches only the path '/api/[^/]+' itself; for every path under /api write /api/{**rest}")]
    [InlineData("Routes:r:Match:Path", "^/api$", "'^/api$' is written as a regular expression, but a route template takes neither: it matches only the path '^/api$' itself; for the path /api alone write /api")]
    [InlineData("Routes:r:Match:Path", "/odata/$metadata", null)] // OData's paths are literal
    [InlineData("Routes:r:Match:Path", "/items/{id:regex(^\\d+$)}", null)] // a constraint's regular expression is one
    [InlineData("Routes:r:Match:Path", "/api/{*rest}", null)]
    // A constraint the router cannot resolve failed every request of every route (500).
    [InlineData("Routes:r:Match:Path", "/items/{id:number}", "'/items/{id:number}': 'number' in {id:number} is not one of ASP.NET Core's route constraints (alpha, bool, datetime, decimal, double, file, float, guid, int, length, long, max, maxlength, min, minlength, nonfile, range, regex, required); ASP.NET Core's router would answer every request of every route 500")]
    [InlineData("Routes:r:Match:Path", "/items/{id:length(x)}", "'/items/{id:length(x)}': {id:length(x)} cannot be used: The input string 'x' was not in a correct format. ASP.NET Core's router would answer every request of every route 500")]
    [InlineData("Routes:r:Match:Path", "/items/{id:regex(()}", "'/items/{id:regex(()}': {id:regex(()} cannot be used: Invalid pattern '(' at offset 1. Not enough )'s. ASP.NET Core's router would answer 500 to each request it tries the route for (to every request of every route where another has a literal segment in its place)")]
    [InlineData("Routes:r:Match:Path", "/items/{id:regex([a-)?}", "'/items/{id:regex([a-)?}': {id:regex([a-)} cannot be used: Invalid pattern")] // an optional parameter's too
    [InlineData("Routes:r:Match:Path", "/items/{id:INT:min(1)}/{slug:alpha:length(1,40)}", null)]
    [InlineData("Routes:r:Match:Path", "/files/{**path:nonfile}", null)]
    // The router matches the decoded path: a literal written with escapes (but %2F, which Kestrel keeps) matched no request.
    [InlineData("Routes:r:Match:Path", "/caf%C3%A9/{**rest}", "'/caf%C3%A9/{**rest}' is matched against the request's path as Kestrel decodes it (every escape but %2F), so the route would match no request; write '/café/{**rest}'")]
    [InlineData("Routes:r:Match:Path", "/files/my%20doc", "'/files/my%20doc' is matched against the request's path as Kestrel decodes it (every escape but %2F), so the route would match no request; write '/files/my doc'")]
    [InlineData("Routes:r:Match:Path", "/m/%2E%2E/{**rest}", "'/m/%2E%2E/{**rest}' is matched against the request's path as Kestrel decodes it (every escape but %2F), so the route would match no request; and no request's path decodes to it (Kestrel refuses a NUL, and resolves dot segments before routing): remove it")]
    [InlineData("Routes:r:Match:Path", "/m/%FF%C3%A9", "'/m/%FF%C3%A9' is matched against the request's path as Kestrel decodes it (every escape but %2F), so the route would match no request; write '/m/%FFé'")] // what Kestrel decodes, and what it keeps
    [InlineData("Routes:r:Match:Path", "/npm/@scope%2Fname/{**rest}", null)] // matched as the client wrote it
    [InlineData("Routes:r:Match:Path", "/odd/%FF", null)] // no UTF-8: Kestrel keeps it escaped
    [InlineData("Routes:r:Match:Path", "/discount/100%", null)] // no escape
    [InlineData("Routes:r:Match:Path", "/café/{**rest}", null)]
    // A PathPattern YARP cannot fill sent the route's requests to '/'.
    [InlineData("Routes:r:Transforms:0:PathPattern", "/v2/{**remainder}", "'/v2/{**remainder}' uses {remainder}, which ReverseProxy:Routes:r:Match:Path does not capture (it captures {rest}); YARP would leave it out of the path it sends, or send / where it is required")]
    [InlineData("Routes:r:Transforms:0:pathpattern", "/v2/{**REST}", null)] // any case, as ASP.NET Core's routing
    [InlineData("Routes:r:Transforms:0:PathPattern", "/v2/{**rest", null)] // YARP refuses what it cannot parse itself
    // An address YARP joins the request's path to as text.
    [InlineData("Clusters:c:Destinations:d1:Address", "http://127.0.0.1:1/?x=1", "'http://127.0.0.1:1/?x=1' has a query (?x=1), which would be put before each request's path")]
    [InlineData("Clusters:c:Destinations:d1:Address", "http://127.0.0.1:1/base#f", "'http://127.0.0.1:1/base#f' has a fragment (#f)")]
    [InlineData("Clusters:c:Destinations:d1:Address", "http://app:s3cret@127.0.0.1:1/", "'http://127.0.0.1:1/' has a user and password (user@), which are never sent")]
    [InlineData("Clusters:c:Destinations:d1:Address", "https://app.internal:8443/base/", null)]
    [InlineData("Clusters:c:Destinations:d1:Health", "not a url", "'not a url' is not an absolute http:// or https:// URL")]
    [InlineData("Clusters:c:Destinations:d1:Health", "http://127.0.0.1:2/?probe=1", "'http://127.0.0.1:2/?probe=1' has a query (?probe=1), which YARP drops from its probes")]
    [InlineData("Clusters:c:Destinations:d1:Health", "http://127.0.0.1:2/", null)]
    [InlineData("Clusters:c:Destinations:d1:Health", "", null)]
    // A probe path YARP's PathString throws on at every probe.
    [InlineData("Clusters:c:HealthCheck:Active:Path", "healthz", "'healthz' does not start with /")]
    [InlineData("Clusters:c:HealthCheck:Active:Path", "/healthz", null)]
    [InlineData("Clusters:c:HealthCheck:Active:Path", "/healthz?ready=1", "'/healthz?ready=1' has a query, which YARP 2.1 would send escaped as part of the path (/healthz%3Fready=1): most upstreams answer such a probe 404, marking every destination unhealthy, the dead with the live, and a catch-all one 200 whatever its state; YARP 2.1 probes a path alone")]
    [InlineData("Clusters:c:HealthCheck:Active:Path", "/healthz#x", "'/healthz#x' has a fragment, which YARP 2.1 would send escaped as part of the path (/healthz%23x)")]
    [InlineData("Clusters:c:HealthCheck:Active:Path", "/health%20check", null)]
    // A destination's own Host, which .NET's client refused at every request.
    [InlineData("Clusters:c:Destinations:d1:Host", "app internal", "'app internal' is not a Host header in ASCII (a name or an address, with a port or none; an international name in punycode, xn--...): .NET's client would refuse it, failing every request to the destination, or send it as other bytes (Latin-1)")]
    [InlineData("Clusters:c:Destinations:d1:Host", "app.internal:http", "'app.internal:http' is not a Host header")]
    [InlineData("Clusters:c:Destinations:d1:Host", "bücher.example", "'bücher.example' is not a Host header in ASCII")]
    [InlineData("Clusters:c:Destinations:d1:Host", "xn--bcher-kva.example", null)]
    [InlineData("Clusters:c:Destinations:d1:Host", "app.internal:8080", null)]
    [InlineData("Clusters:c:Destinations:d1:Host", "[::1]:8080", null)]
    [InlineData("Clusters:c:Destinations:d1:Host", "bucket.s3.eu-west-1.amazonaws.com", null)]
    // YARP answered every request 504 at once at 0, and 500 with a stack below it.
    [InlineData("Clusters:c:HttpRequest:ActivityTimeout", "00:00:00", "'00:00:00' comes to 0 ms, as YARP counts it (whole milliseconds): it would answer every request of the cluster 504 at once; for long-lived requests give a long one, such as 1.00:00:00")]
    [InlineData("Clusters:c:HttpRequest:ActivityTimeout", "00:00:00.0005", "'00:00:00.0005' comes to 0 ms")]
    [InlineData("Clusters:c:HttpRequest:ActivityTimeout", "-00:00:00.0005", "'-00:00:00.0005' comes to 0 ms")]
    [InlineData("Clusters:c:HttpRequest:ActivityTimeout", "-00:00:01", "'-00:00:01' is negative: YARP would fail every request of the cluster (500)")]
    [InlineData("Clusters:c:HttpRequest:ActivityTimeout", "-00:00:00.001", null)] // .NET's "none" (Timeout.InfiniteTimeSpan), as YARP takes it
    [InlineData("Clusters:c:HttpRequest:ActivityTimeout", "00:00:00.001", null)]
    [InlineData("Clusters:c:HttpRequest:ActivityTimeout", "1.00:00:00", null)]
    // HTTP/3 required where .NET's client cannot have it failed every request (502).
    [InlineData("Clusters:c:HttpRequest:Version", "3", null)] // RequestVersionOrLower, YARP's default: HTTP/3 where it can be had
    public void Value_AProblemOfItsKey_OnlyWhereYarpCannotServeIt(string key, string value, string? problem)
    {
        var values = Base();
        values[$"ReverseProxy:{key}"] = value;

        Load(values, out var problems);

        if (problem is null)
        {
            Assert.Empty(problems);
        }
        else
        {
            var found = Assert.Single(problems);
            Assert.Equal($"ReverseProxy:{key}", found.Key, ignoreCase: true);
            Assert.StartsWith(problem, found.Message, StringComparison.Ordinal);
            Assert.DoesNotContain("s3cret", found.Message, StringComparison.Ordinal);
        }
    }

    /// <summary>
    /// Settings that fail only together: a session-affinity cookie or header, and the headers a
    /// route's transforms set. Each was taken by YARP, then failed every request of its route or
    /// cluster (a name that is not a token, a value with a control character, a framing header), or
    /// set a cookie browsers refuse, so that affinity never held.
    /// </summary>
    [Theory]
    // The affinity cookie's or header's name: not a token, every response of the cluster a 502.
    [InlineData("A:Enabled=true|A:Policy=Cookie|A:AffinityKeyName=a;b", "A:AffinityKeyName", "'a;b' is not a cookie name (letters, digits and !#$%&'*+-.^_`|~): the affinity cookie could not be set, and every request of the cluster would fail after its upstream had answered")]
    [InlineData("A:Enabled=true|A:Policy=ArrCookie|A:AffinityKeyName=a=b", "A:AffinityKeyName", "'a=b' is not a cookie name")]
    [InlineData("A:Enabled=true|A:Policy=Cookie|A:AffinityKeyName=café", "A:AffinityKeyName", "'café' is not a cookie name")]
    [InlineData("A:Enabled=true|A:Policy=CustomHeader|A:AffinityKeyName=x:aff", "A:AffinityKeyName", "'x:aff' is not a header name (letters, digits and !#$%&'*+-.^_`|~): the affinity header could not be set")]
    [InlineData("A:Enabled=true|A:Policy=CustomHeader|A:AffinityKeyName=x-aff", null, null)]
    [InlineData("A:Enabled=true|A:Policy=ArrCookie|A:AffinityKeyName=tern-affinity", null, null)]
    [InlineData("A:Enabled=false|A:Policy=Cookie|A:AffinityKeyName=a;b", null, null)] // never set
    // The cookie's Path and Domain went into Set-Cookie as written.
    [InlineData("A:Enabled=true|A:Policy=Cookie|A:AffinityKeyName=aff|A:Cookie:Path=/app;b", "A:Cookie:Path", "'/app;b' is not a cookie path: one starting with /, of visible ASCII other than ';' (percent-encode the rest, as browsers send paths); leave it out for /")]
    [InlineData("A:Enabled=true|A:Policy=Cookie|A:AffinityKeyName=aff|A:Cookie:Path=app", "A:Cookie:Path", "'app' is not a cookie path")]
    [InlineData("A:Enabled=true|A:Policy=Cookie|A:AffinityKeyName=aff|A:Cookie:Path=", "A:Cookie:Path", "'' is not a cookie path")]
    [InlineData("A:Enabled=true|A:Policy=Cookie|A:AffinityKeyName=aff|A:Cookie:Path=/café", "A:Cookie:Path", "'/café' is not a cookie path")]
    [InlineData("A:Enabled=true|A:Policy=Cookie|A:AffinityKeyName=aff|A:Cookie:Path=/app", null, null)]
    [InlineData("A:Enabled=true|A:Policy=ArrCookie|A:AffinityKeyName=aff|A:Cookie:Domain=example.com;x", "A:Cookie:Domain", "'example.com;x' is not a host name in ASCII (example.com, which takes in its subdomains; an international name in punycode, xn--...): browsers would refuse the cookie")]
    [InlineData("A:Enabled=true|A:Policy=ArrCookie|A:AffinityKeyName=aff|A:Cookie:Domain=example.com:8443", "A:Cookie:Domain", "'example.com:8443' is not a host name in ASCII")]
    [InlineData("A:Enabled=true|A:Policy=ArrCookie|A:AffinityKeyName=aff|A:Cookie:Domain=bücher.example", "A:Cookie:Domain", "'bücher.example' is not a host name in ASCII")]
    [InlineData("A:Enabled=true|A:Policy=ArrCookie|A:AffinityKeyName=aff|A:Cookie:Domain=..example.com", "A:Cookie:Domain", "'..example.com' is not a host name in ASCII")]
    [InlineData("A:Enabled=true|A:Policy=ArrCookie|A:AffinityKeyName=aff|A:Cookie:Domain=.example.com", null, null)]
    [InlineData("A:Enabled=true|A:Policy=ArrCookie|A:AffinityKeyName=aff|A:Cookie:Domain=xn--bcher-kva.example", null, null)]
    [InlineData("A:Enabled=true|A:Policy=ArrCookie|A:AffinityKeyName=aff|A:Cookie:Domain=localhost", null, null)]
    [InlineData("A:Enabled=true|A:Policy=ArrCookie|A:AffinityKeyName=aff|A:Cookie:Domain=10.0.0.1", null, null)]
    // A number YARP reads as a value the enum does not define: no policy ASP.NET Core knows.
    [InlineData("A:Enabled=true|A:Policy=Cookie|A:AffinityKeyName=aff|A:Cookie:SecurePolicy=5", "A:Cookie:SecurePolicy", "'5' is not one of SameAsRequest, Always, None")]
    [InlineData("A:Enabled=true|A:Policy=Cookie|A:AffinityKeyName=aff|A:Cookie:SameSite=7", "A:Cookie:SameSite", "'7' is not one of None, Lax, Strict, Unspecified")]
    [InlineData("A:enabled=True|A:policy=cookie|A:affinitykeyname=aff|A:cookie:securepolicy=1|A:cookie:samesite=0", null, null)] // Always and None, as YARP reads them
    // Browsers refuse a cookie they are told to keep Secure that is not.
    [InlineData("A:Enabled=true|A:Policy=Cookie|A:AffinityKeyName=aff|A:Cookie:SameSite=none|A:Cookie:SecurePolicy=none", "A:Cookie:SameSite", "None needs the cookie marked Secure, which SecurePolicy None leaves out: browsers would refuse the cookie, and affinity would never hold; leave SecurePolicy out (Secure over HTTPS) or set it to Always")]
    [InlineData("A:Enabled=true|A:Policy=Cookie|A:AffinityKeyName=aff|A:Cookie:SameSite=None", null, null)] // Secure over HTTPS
    [InlineData("A:Enabled=true|A:Policy=Cookie|A:AffinityKeyName=aff|A:Cookie:SameSite=Lax|A:Cookie:SecurePolicy=None", null, null)]
    [InlineData("A:Enabled=true|A:Policy=Cookie|A:AffinityKeyName=__Secure-aff|A:Cookie:SecurePolicy=None", "A:AffinityKeyName", "'__Secure-aff' needs the cookie marked Secure, which SecurePolicy None leaves out")]
    [InlineData("A:Enabled=true|A:Policy=Cookie|A:AffinityKeyName=__Host-aff|A:Cookie:Path=/app", "A:AffinityKeyName", "'__Host-aff' needs the cookie without a Domain and with the Path /: browsers would refuse the cookie, and affinity would never hold; leave Cookie:Domain and Cookie:Path out")]
    [InlineData("A:Enabled=true|A:Policy=Cookie|A:AffinityKeyName=__host-aff|A:Cookie:Domain=example.com", "A:AffinityKeyName", "'__host-aff' needs the cookie without a Domain")]
    [InlineData("A:Enabled=true|A:Policy=Cookie|A:AffinityKeyName=__Host-aff|A:Cookie:Path=/", null, null)]
    // A transform's header: a name .NET's client or Kestrel refuses, a value they refuse or drop, a framing header.
    [InlineData("T:RequestHeader=X:Bad|T:Set=1", "T:RequestHeader", "'X:Bad' is not a header name (letters, digits and !#$%&'*+-.^_`|~): every request of the route would fail")]
    [InlineData("T:requestheader=X Bad|T:set=1", "T:requestheader", "'X Bad' is not a header name")] // any case, as YARP reads them
    [InlineData("T:ResponseHeader=X-Bad:|T:Append=1", "T:ResponseHeader", "'X-Bad:' is not a header name")]
    [InlineData("T:ResponseTrailer=X:T|T:Set=1", "T:ResponseTrailer", "'X:T' is not a header name")]
    [InlineData("T:RequestHeaderRouteValue=X:Id|T:Set=id", "T:RequestHeaderRouteValue", "'X:Id' is not a header name")]
    [InlineData("T:ClientCert=X Cert", "T:ClientCert", "'X Cert' is not a header name")]
    [InlineData("T:X-Forwarded=Set|T:HeaderPrefix=X:", "T:HeaderPrefix", "'X:' makes no header name (letters, digits and !#$%&'*+-.^_`|~): every request of the route would fail")]
    [InlineData("T:X-Forwarded=Set|T:HeaderPrefix=My-", null, null)]
    [InlineData("T:RequestHeader=X-A|T:Set=a\r\nX-Injected: 1", "T:Set", "'a\\r\\nX-Injected: 1' holds a control character (U+000D), which no header value may carry (RFC 9110): Kestrel fails a response that has one, and .NET's client drops a request header with a line break and sends the others, for the upstream to refuse")]
    [InlineData("T:ResponseHeader=X-A|T:Append=a\u0001", "T:Append", "'a\\u0001' holds a control character (U+0001)")]
    [InlineData("T:ResponseTrailer=X-A|T:Set=a\nb", "T:Set", "'a\\nb' holds a control character (U+000A)")]
    [InlineData("T:ResponseHeader=X-A|T:Set=a\tb; c=\"d\"", null, null)] // a tab is a value's
    [InlineData("T:RequestHeader=X-A|T:Set=café", "T:Set", "'café' holds U+00E9, outside ASCII: Tern sends each character of a header as one byte, so it would arrive as the byte 0xE9, not as UTF-8; write the value in ASCII (percent-encoded, say)")]
    [InlineData("T:ResponseHeader=X-A|T:Append=snow☃", "T:Append", "'snow☃' holds U+2603, outside ASCII: Tern sends each character of a header as one byte, so it would arrive as '?'")]
    [InlineData("T:RequestHeaderRouteValue=X-Id|T:Set=a b", null, null)] // Set names a route value here
    [InlineData("T:ResponseHeader=Content-Length|T:Set=5", "T:ResponseHeader", "'Content-Length' frames the message, and Tern frames each from its body: set by a transform, it failed every request of the route, or mislabelled the response's body; remove the transform")]
    [InlineData("T:ResponseHeader=Transfer-Encoding|T:Set=gzip", "T:ResponseHeader", "'Transfer-Encoding' frames the message")]
    [InlineData("T:RequestHeader=transfer-encoding|T:Set=chunked", "T:RequestHeader", "'transfer-encoding' frames the message")]
    [InlineData("T:ResponseHeaderRemove=Content-Length", null, null)]
    [InlineData("T:RequestHeader=Host|T:Set=app.internal", null, null)]
    // Paths and query names and values YARP escapes itself: written with escapes, they went escaped twice; a '?' or '#' went escaped into the path.
    [InlineData("T:PathSet=/search?q=1", "T:PathSet", "'/search?q=1' holds '?', which YARP would send escaped inside the path (%3F), not as the start of a query; set query values with QueryValueParameter")]
    [InlineData("T:PathPrefix=/v2#top", "T:PathPrefix", "'/v2#top' holds '#', which YARP would send escaped inside the path (%23), not as a fragment, which upstreams never get")]
    [InlineData("T:PathPattern=/v2#x/{**rest}", "T:PathPattern", "'/v2#x/{**rest}' holds '#'")]
    [InlineData("T:PathSet=/caf%C3%A9", "T:PathSet", "'/caf%C3%A9' is written with escapes, but YARP escapes the value itself: '%C3' would reach the upstream as '%25C3'; write the characters themselves ('/café')")]
    [InlineData("T:PathPrefix=/npm/@scope%2fname", "T:PathPrefix", "'/npm/@scope%2fname' is written with escapes, but YARP escapes the value itself: '%2f' would reach the upstream as '%252f'")] // no way to send an escaped slash
    [InlineData("T:PathPattern=/my%20docs/{**rest}", "T:PathPattern", "'/my%20docs/{**rest}' is written with escapes, but YARP escapes the value itself: '%20' would reach the upstream as '%2520'; write the characters themselves ('/my docs/{**rest}')")]
    [InlineData("T:QueryValueParameter=tags%5B%5D|T:Set=1", "T:QueryValueParameter", "'tags%5B%5D' is written with escapes, but YARP escapes the value itself: '%5B' would reach the upstream as '%255B'; write the characters themselves ('tags[]')")]
    [InlineData("T:QueryValueParameter=q|T:Append=a%20b", "T:Append", "'a%20b' is written with escapes")]
    [InlineData("M:Path=/r/{rest}|T:PathPattern=/v2/{rest=a%20b}", null, null)] // a default never reaches the upstream
    [InlineData("T:PathPattern=/v2/{*rest}", "T:PathPattern", "'/v2/{*rest}' has {*rest}, a catch-all YARP fills with each '/' escaped and then escapes again: /a/b would reach the upstream as /a%252Fb; write {**rest}")]
    [InlineData("M:Path=/r/{rest}|T:PathPattern=/v2/{*rest}", null, null)] // a value of one segment: no '/' to escape
    [InlineData("T:PathPattern=/v2/{rest}", "T:PathPattern", "'/v2/{rest}' has {rest}, one segment, for a value the route's Match:Path catches whole: YARP would fill it with each '/' escaped and then escape that again, so /a/b would reach the upstream as /a%252Fb; write {**rest}")]
    [InlineData("M:Path=|M:Hosts:0=example.com|T:PathPattern=/v2/{**catchall}", null, null)] // YARP matches a route with Hosts alone on /{**catchall}
    [InlineData("M:Path=|M:Hosts:0=example.com|T:PathPattern=/v2/{*catchall}", "T:PathPattern", "'/v2/{*catchall}' has {*catchall}, a catch-all YARP fills with each '/' escaped")]
    [InlineData("T:PathRemovePrefix=/api%00", "T:PathRemovePrefix", "'/api%00' is compared with the request's path as Kestrel decodes it (every escape but %2F), so it would never be removed; and no request's path decodes to it (Kestrel refuses a NUL, and resolves dot segments before routing): remove it")]
    [InlineData("T:QueryValueParameter=q|T:Set=a%20b", "T:Set", "'a%20b' is written with escapes, but YARP escapes the value itself: '%20' would reach the upstream as '%2520'; write the characters themselves ('a b')")]
    [InlineData("T:QueryRouteParameter=q%20x|T:Set=rest", "T:QueryRouteParameter", "'q%20x' is written with escapes")]
    [InlineData("T:PathSet=/café/a b", null, null)]
    [InlineData("T:PathPrefix=/100%", null, null)] // no escape
    [InlineData("T:QueryValueParameter=q|T:Set=a&b=c#d", null, null)] // a value: YARP escapes it whole
    [InlineData("T:QueryRouteParameter=q|T:Set=%20", null, null)] // Set names a route value here
    // A prefix or query name to remove, compared with the decoded path or query (but %2F), or ending where no segment does: never removed.
    [InlineData("T:PathRemovePrefix=/api/", "T:PathRemovePrefix", "'/api/' ends with '/': YARP removes a prefix where a segment ends, so it would be removed only from the path '/api/' itself and paths that begin '/api//', never from the paths under it ('/api/x'); write '/api'")]
    [InlineData("T:PathRemovePrefix=/", "T:PathRemovePrefix", "'/' is removed only from paths that begin '//': YARP removes a prefix where a segment ends; remove the transform")]
    [InlineData("T:PathRemovePrefix=/api%20v2", "T:PathRemovePrefix", "'/api%20v2' is compared with the request's path as Kestrel decodes it (every escape but %2F), so it would never be removed; write '/api v2'")]
    [InlineData("T:QueryRemoveParameter=utm%5Fsource", "T:QueryRemoveParameter", "'utm%5Fsource' is compared with the request's decoded query names, so it would never be removed; write 'utm_source'")]
    [InlineData("T:PathRemovePrefix=/api", null, null)]
    [InlineData("T:PathRemovePrefix=/npm/@scope%2Fname", null, null)] // Kestrel keeps %2F, so it is compared as written
    [InlineData("T:QueryRemoveParameter=utm_source", null, null)]
    // A method .NET's client takes for a tunnel, or one Tern refuses from clients.
    [InlineData("T:HttpMethodChange=GET|T:Set=connect", "T:Set", "'connect' would make .NET's client ask the upstream for a tunnel (CONNECT host:port, the path left out) instead of sending the request, and pass the client the raw bytes of its answer, framing and all, until one side closed")]
    [InlineData("T:HttpMethodChange=GET|T:Set=TRACE", "T:Set", "'TRACE' asks the upstream to echo the request, its cookies and credentials with it, back to the client (cross-site tracing), which is why Tern answers a client's TRACE 405")]
    [InlineData("T:HttpMethodChange=GET|T:Set=POST", null, null)]
    // HTTP/3 required where .NET's client cannot have it.
    [InlineData("ReverseProxy:Clusters:c:HttpRequest:Version=3|ReverseProxy:Clusters:c:HttpRequest:VersionPolicy=RequestVersionExact", "ReverseProxy:Clusters:c:HttpRequest:Version", "'3' with VersionPolicy RequestVersionExact asks for HTTP/3, which runs over TLS only, and destination 'd1' is http://: every request to it would fail (502); give https:// destinations (VersionPolicy RequestVersionOrLower would send this one HTTP/1.1)")]
    [InlineData("ReverseProxy:Clusters:c:HttpRequest:Version=3.0|ReverseProxy:Clusters:c:HttpRequest:VersionPolicy=1", "ReverseProxy:Clusters:c:HttpRequest:Version", "'3.0' with VersionPolicy RequestVersionOrHigher asks for HTTP/3, which runs over TLS only")] // by number, as YARP reads it
    [InlineData("ReverseProxy:Clusters:c:HttpRequest:Version=2|ReverseProxy:Clusters:c:HttpRequest:VersionPolicy=RequestVersionExact", null, null)] // HTTP/2 without TLS (prior knowledge)
    // A query match, compared with the decoded query: written with escapes, carried by no request.
    [InlineData("M:QueryParameters:0:Name=utm%5Fsource|M:QueryParameters:0:Mode=Exists", "M:QueryParameters:0:Name", "'utm%5Fsource' is compared with the request's decoded query names, so no request carries it, and the route would match none; write 'utm_source'")]
    [InlineData("M:QueryParameters:0:Name=debug%20mode|M:QueryParameters:0:Mode=NotContains|M:QueryParameters:0:Values:0=on", "M:QueryParameters:0:Name", "'debug%20mode' is compared with the request's decoded query names, so no request carries it, and the route would match every request its other matches take; write 'debug mode'")]
    [InlineData("M:QueryParameters:0:Name=q|M:QueryParameters:0:Values:0=a%20b", "M:QueryParameters:0:Values:0", "'a%20b' is compared with the request's decoded query values, so it would never match; write 'a b'")]
    [InlineData("M:QueryParameters:0:Name=q|M:QueryParameters:0:Mode=notcontains|M:QueryParameters:0:Values:0=a%2Fb", "M:QueryParameters:0:Values:0", "'a%2Fb' is compared with the request's decoded query values, so it would never match (NotContains: every request that has the parameter would); write 'a/b'")]
    [InlineData("M:QueryParameters:0:Name=utm_source|M:QueryParameters:0:Mode=Exists", null, null)]
    [InlineData("M:QueryParameters:0:Name=q|M:QueryParameters:0:Values:0=100%", null, null)] // no escape
    // A header match by its absence, on a name no request carries: the route matched every request.
    [InlineData("M:Headers:0:Name=X Tenant|M:Headers:0:Mode=NotExists", "M:Headers:0:Name", "'X Tenant' is not a header name (letters, digits and !#$%&'*+-.^_`|~): no request carries it, so the route would match every request its other matches take")]
    [InlineData("M:Headers:0:Name=X Tenant|M:Headers:0:Mode=5", "M:Headers:0:Name", "'X Tenant' is not a header name (letters, digits and !#$%&'*+-.^_`|~): no request carries it, so the route would match every request")] // NotExists by number, as YARP reads it
    [InlineData("M:Headers:0:Name=X Tenant|M:Headers:0:Mode=Exists", "M:Headers:0:Name", "'X Tenant' is not a header name (letters, digits and !#$%&'*+-.^_`|~): no request carries it, so the route would match none")]
    public void SettingsTogether_AProblemOfTheKeyNamed(string settings, string? key, string? problem)
    {
        static string Full(string key) => key.Replace("A:", $"{Cluster}:SessionAffinity:", StringComparison.Ordinal).Replace("T:", $"{Route}:Transforms:0:", StringComparison.Ordinal).Replace("M:", $"{Route}:Match:", StringComparison.Ordinal);

        var values = Base();
        foreach (var setting in settings.Split('|'))
        {
            var at = setting.IndexOf('=', StringComparison.Ordinal);
            values[Full(setting[..at])] = setting[(at + 1)..];
        }

        Load(values, out var problems);

        if (problem is null)
        {
            Assert.Empty(problems);
        }
        else
        {
            var found = Assert.Single(problems);
            Assert.Equal(Full(key!), found.Key);
            Assert.StartsWith(problem, found.Message, StringComparison.Ordinal);
        }
    }

    [Fact]
    public void Http3RequiredOverTls_RefusedOnlyWhereDotNetCannotSpeakIt()
    {
        var values = Base();
        values[$"{Cluster}:Destinations:d1:Address"] = "https://127.0.0.1:1/";
        values[$"{Cluster}:HttpRequest:Version"] = "3.0";
        values[$"{Cluster}:HttpRequest:VersionPolicy"] = "RequestVersionExact";

        Load(values, out var problems);

        if ((OperatingSystem.IsLinux() || OperatingSystem.IsWindows() || OperatingSystem.IsMacOS()) && System.Net.Quic.QuicConnection.IsSupported)
        {
            Assert.Empty(problems);
        }
        else
        {
            var found = Assert.Single(problems);
            Assert.Equal($"{Cluster}:HttpRequest:Version", found.Key);
            Assert.Equal("'3.0' with VersionPolicy RequestVersionExact asks for HTTP/3, which .NET cannot speak on this machine (its QUIC is not supported here: it needs libmsquic); every request of the cluster would fail (502); give VersionPolicy RequestVersionOrLower to take HTTP/3 where it can be had", found.Message);
        }
    }

    [Theory]
    [InlineData("ReverseProxy:Clusters:c:HttpRequest:ActivityTimout", "00:00:05", "ReverseProxy:Clusters:c:HttpRequest:ActivityTimout", 108, "is not read by YARP 2.1 and is ignored (misspelt? YARP reads ActivityTimeout)")]
    [InlineData("ReverseProxy:Routes:r:Path", "/x", "ReverseProxy:Routes:r:Path", 108, "is not read by YARP 2.1 and is ignored (YARP reads it as Match:Path under ReverseProxy:Routes:r)")]
    [InlineData("ReverseProxy:Clusters:c:Address", "http://x/", "ReverseProxy:Clusters:c:Address", 108, "is not read by YARP 2.1 and is ignored (YARP reads it as Destinations:<name>:Address under ReverseProxy:Clusters:c)")]
    [InlineData("ReverseProxy:Clusters:c:Destinatons:d2:Address", "http://x/", "ReverseProxy:Clusters:c:Destinatons", 108, "is not read by YARP 2.1 and is ignored (misspelt? YARP reads Destinations)")] // named once, where it goes wrong
    [InlineData("ReverseProxy:Clusters:c:HealthCheck:Active:Query", "a=1", "ReverseProxy:Clusters:c:HealthCheck:Active:Query", 108, "is not read by YARP 2.1 and is ignored (misspelt, or a setting of a later YARP?)")] // a later YARP's
    [InlineData("ReverseProxy:Routes:r:Transforms:0:RequestHeader:x", "1", "ReverseProxy:Routes:r:Transforms:0:RequestHeader:x", 108, "is not read by YARP 2.1 and is ignored (ReverseProxy:Routes:r:Transforms:0:RequestHeader takes a value, not settings under it)")]
    [InlineData("ReverseProxy:Clusters:c:HttpClient:SslProtocols", "Tls12", "ReverseProxy:Clusters:c:HttpClient:SslProtocols", 109, "is a list: the value given to it is ignored; give its items as ReverseProxy:Clusters:c:HttpClient:SslProtocols:0, ReverseProxy:Clusters:c:HttpClient:SslProtocols:1, ... (environment: ReverseProxy__Clusters__c__HttpClient__SslProtocols__0, ...)")]
    [InlineData("ReverseProxy:Routes:r:Transforms:PathPrefix", "/x", "ReverseProxy:Routes:r:Transforms:PathPrefix", 109, "is an item of the list ReverseProxy:Routes:r:Transforms, a section: the value given to it is ignored; write ReverseProxy:Routes:r:Transforms:0:PathPrefix (environment: ReverseProxy__Routes__r__Transforms__0__PathPrefix)")]
    [InlineData("ReverseProxy:Routes", "5", "ReverseProxy:Routes", 109, "is a section, not a setting: the value given to it is ignored; give the settings under it (ReverseProxy:Routes:...; environment: ReverseProxy__Routes__...)")]
    [InlineData("ReverseProxy", "5", "ReverseProxy", 109, "is a section, not a setting")]
    [InlineData("Tern:Https", "5", "Tern:Https", 109, "is a section, not a setting: the value given to it is ignored; give the settings under it (Tern:Https:...; environment: Tern__Https__...)")]
    [InlineData("Tern", "5", "Tern", 109, "is a section, not a setting")]
    [InlineData("Kestrel:Limits", "5", "Kestrel:Limits", 109, "is a section, not a setting")]
    [InlineData("Kestrel", "5", "Kestrel", 109, "is a section, not a setting")]
    [InlineData("Kestrel:AddServerHeader", "true", "Kestrel:AddServerHeader", 107, "is ignored: of the Kestrel section Tern reads only Kestrel:Limits")]
    [InlineData("Tern:Htps:Port", "1", "Tern:Htps:Port", 104, "is not a Tern setting and is ignored (misspelt?)")]
    // Metadata names under Tern's or YARP's prefixes that neither reads: misspelt, or given to a route where a cluster's is read.
    [InlineData("ReverseProxy:Clusters:c:Metadata:Tern.ConnectTimout", "00:00:03", "ReverseProxy:Clusters:c:Metadata:Tern.ConnectTimout", 108, "is not read by Tern or YARP and is ignored (misspelt? a cluster's Metadata is read for Tern.ConnectTimeout)")]
    [InlineData("ReverseProxy:Clusters:c:Metadata:ConsecutiveFailuresHealthPolicy.Treshold", "3", "ReverseProxy:Clusters:c:Metadata:ConsecutiveFailuresHealthPolicy.Treshold", 108, "is not read by Tern or YARP and is ignored (misspelt? a cluster's Metadata is read for ConsecutiveFailuresHealthPolicy.Threshold)")]
    [InlineData("ReverseProxy:Routes:r:Metadata:Tern.ConnectTimeout", "00:00:03", "ReverseProxy:Routes:r:Metadata:Tern.ConnectTimeout", 108, "is not read by Tern or YARP and is ignored (Tern.ConnectTimeout is read from a cluster's Metadata, not a route's)")]
    [InlineData("ReverseProxy:Clusters:c:Metadata:Tern.AllowPlainHttp", "true", "ReverseProxy:Clusters:c:Metadata:Tern.AllowPlainHttp", 108, "is not read by Tern or YARP and is ignored (Tern.AllowPlainHttp is read from a route's Metadata, not a cluster's)")]
    [InlineData("ReverseProxy:Routes:r:Metadata:Tern.Team", "payments", "ReverseProxy:Routes:r:Metadata:Tern.Team", 108, "is not read by Tern or YARP and is ignored (a route's Metadata is read for Tern.AllowPlainHttp)")]
    [InlineData("ReverseProxy:Clusters:c:Metadata:ConsecutiveFailureHealthPolicy.Threshold", "3", "ReverseProxy:Clusters:c:Metadata:ConsecutiveFailureHealthPolicy.Threshold", 108, "is not read by Tern or YARP and is ignored (misspelt? a cluster's Metadata is read for ConsecutiveFailuresHealthPolicy.Threshold)")] // the prefix misspelt
    [InlineData("ReverseProxy:Clusters:c:Destinations:d1:Metadata:Tern.ConnectTimeout", "00:00:03", "ReverseProxy:Clusters:c:Destinations:d1:Metadata:Tern.ConnectTimeout", 108, "is not read by Tern or YARP and is ignored (Tern.ConnectTimeout is read from a cluster's Metadata, not a destination's)")]
    [InlineData("ReverseProxy:Clusters:c:Destinations:d1:Metadata:Tern.Zone", "a", "ReverseProxy:Clusters:c:Destinations:d1:Metadata:Tern.Zone", 108, "is not read by Tern or YARP and is ignored (nothing is read from a destination's Metadata)")]
    public void KeyNothingReads_IsNamedAsIgnored_WithTheNameMeant(string key, string value, string named, int eventId, string reason)
    {
        var values = Base();
        values["Tern:Https:Port"] = "8443";
        values["Kestrel:Limits:MaxRequestBodySize"] = "1000";
        values[key] = value;

        var snapshot = Load(values, out var problems);

        Assert.Empty(problems);
        var unread = Assert.Single(snapshot!.Unread);
        Assert.Equal(named, unread.Key);
        Assert.StartsWith(reason, unread.Reason, StringComparison.Ordinal);
        Assert.Equal(eventId, unread.Kind switch
        {
            UnreadSetting.Kinds.NotTern => 104,
            UnreadSetting.Kinds.NotKestrelLimit => 107,
            UnreadSetting.Kinds.NotYarp => 108,
            _ => 109,
        });
    }

    /// <summary>What YARP drops from a route's Match leaves the route matching more than written: refused, not warned of.</summary>
    [Theory]
    [InlineData("ReverseProxy:Routes:r:Match:Host:0", "admin.example.com", "ReverseProxy:Routes:r:Match:Host", "is not read by YARP 2.1 (misspelt? YARP reads Hosts), so the route would not match as written")]
    [InlineData("ReverseProxy:Routes:r:Match:Pth", "/x", "ReverseProxy:Routes:r:Match:Pth", "is not read by YARP 2.1 (misspelt? YARP reads Path), so the route would not match as written")]
    [InlineData("ReverseProxy:Routes:r:Match:Hosts", "admin.example.com", "ReverseProxy:Routes:r:Match:Hosts", "is a list: YARP would ignore the value given to it, and the route would not match as written; give its items as ReverseProxy:Routes:r:Match:Hosts:0, ReverseProxy:Routes:r:Match:Hosts:1, ... (environment: ReverseProxy__Routes__r__Match__Hosts__0, ...)")]
    [InlineData("ReverseProxy:Routes:r:Match:Methods", "GET", "ReverseProxy:Routes:r:Match:Methods", "is a list: YARP would ignore the value given to it")]
    [InlineData("ReverseProxy:Routes:r:Match:Headers:Name", "X-Admin", "ReverseProxy:Routes:r:Match:Headers:Name", "is an item of the list ReverseProxy:Routes:r:Match:Headers, a section: YARP would ignore the value given to it, and the route would not match as written; write ReverseProxy:Routes:r:Match:Headers:0:Name")]
    public void MatchKeyYarpDoesNotRead_IsAProblem(string key, string value, string named, string message)
    {
        var values = Base();
        values[key] = value;

        Load(values, out var problems);

        var found = Assert.Single(problems);
        Assert.Equal(named, found.Key);
        Assert.StartsWith(message, found.Message, StringComparison.Ordinal);
    }

    /// <summary>A Match:Path ASP.NET Core cannot parse is YARP's to name ("Invalid path"); a PathPattern is not blamed for it.</summary>
    [Fact]
    public void PathPattern_OnAPathYarpRefuses_IsNotBlamed()
    {
        var values = Base();
        values[$"{Route}:Match:Path"] = "/api/{**rest";
        values[$"{Route}:Transforms:0:PathPattern"] = "/v2/{**rest}";

        Load(values, out var problems);

        Assert.Empty(problems);
    }

    /// <summary>Each problem is one line: a value quoted in it may hold line breaks (a JSON string can).</summary>
    [Fact]
    public void ValueWithALineBreak_IsQuotedOnOneLine()
    {
        var values = Base();
        values[$"{Route}:Match:Hosts:0"] = "a\nb:c:d";

        Load(values, out var problems);

        var found = Assert.Single(problems);
        Assert.StartsWith("'a\\nb:c:d': ASP.NET Core's host matching cannot match", found.Message, StringComparison.Ordinal);
        Assert.Equal("x\\ty", (found with { Message = "x\ty" }).Message); // however it is made
    }

    [Theory]
    [InlineData("ReverseProxy:Routes:r:Transforms", "")] // JSON's [] and {} arrive as empty values
    [InlineData("ReverseProxy:Clusters:c:Metadata", "")]
    [InlineData("ReverseProxy:Routes:r:Metadata:Owner.Team", "web")] // metadata names are free
    public void EmptySectionsAndFreeNames_AreNotIgnoredKeys(string key, string value)
    {
        var values = Base();
        values[key] = value;

        var snapshot = Load(values, out var problems);

        Assert.Empty(problems);
        Assert.Empty(snapshot!.Unread);
    }

    /// <summary>
    /// Every property of YARP's route and cluster types, as its configuration reader reads it, is
    /// a key Tern knows: a YARP upgrade that reads a new key fails here until YarpKeys has it.
    /// </summary>
    [Fact]
    public void EveryKeyYarpsConfigTypesHave_IsRead()
    {
        var values = Base();
        foreach (var key in Keys($"{Route}", typeof(RouteConfig)).Concat(Keys(Cluster, typeof(ClusterConfig))))
        {
            values.TryAdd(key, "x");
        }

        Assert.True(values.Count > 60, $"only {values.Count} keys generated");
        var unread = Yarp(values);
        Assert.Empty(unread);
    }

    private static List<UnreadSetting> Yarp(Dictionary<string, string?> values) =>
        [.. YarpKeys.Unread(values.Where(v => v.Key.StartsWith("ReverseProxy", StringComparison.OrdinalIgnoreCase)))];

    /// <summary>The keys YARP's reader reads for a config type: ids are the section names, lists and dictionaries take any child name.</summary>
    private static IEnumerable<string> Keys(string prefix, Type type)
    {
        foreach (var property in type.GetProperties(BindingFlags.Public | BindingFlags.Instance).Where(p => p.CanWrite || p.SetMethod is not null))
        {
            if (property.Name is "RouteId" or "ClusterId")
            {
                continue;
            }

            var key = $"{prefix}:{property.Name}";
            var propertyType = Nullable.GetUnderlyingType(property.PropertyType) ?? property.PropertyType;
            foreach (var child in Keys(key, propertyType, property.Name))
            {
                yield return child;
            }
        }
    }

    private static IEnumerable<string> Keys(string key, Type type, string name)
    {
        if (name == "SslProtocols")
        {
            return [$"{key}:0"]; // a flags enum, read as a list of names
        }

        if (type == typeof(string) || type.IsPrimitive || type.IsEnum || type == typeof(TimeSpan) || type == typeof(Version) || type == typeof(Uri) || type == typeof(System.Text.Encoding))
        {
            return [key];
        }

        if (type.IsGenericType && type.GetGenericArguments() is [var keyType, var valueType] && typeof(IEnumerable).IsAssignableFrom(type) && keyType == typeof(string))
        {
            return Keys($"{key}:anyname", Nullable.GetUnderlyingType(valueType) ?? valueType, name); // a dictionary
        }

        if (type.IsArray || (type.IsGenericType && typeof(IEnumerable).IsAssignableFrom(type)))
        {
            var element = type.IsArray ? type.GetElementType()! : type.GetGenericArguments()[0];
            return Keys($"{key}:0", element, name);
        }

        return Keys(key, type);
    }
}
