using System.Globalization;
using System.Net;
using System.Net.Sockets;
using System.Text.Json;
using Tern.Tests.Infrastructure;

namespace Tern.Tests.Lifecycle;

/// <summary>The real proxy process, on the shipped config, configured only through the environment.</summary>
public abstract class ProcessTests(string engine)
{
    public static TheoryData<string, string, string> InvalidConfigurations() => new()
    {
        { "unknown cluster", "ReverseProxy__Routes__default__ClusterId=nope", "error: ReverseProxy:Routes:default:ClusterId: cluster 'nope' is not defined under ReverseProxy:Clusters" },
        { "destination not a URL", "ReverseProxy__Clusters__app__Destinations__d1__Address=ftp://10.0.0.5/", "error: ReverseProxy:Clusters:app:Destinations:d1:Address: 'ftp://10.0.0.5/' is not an absolute http:// or https:// URL" },
        { "relative destination", "ReverseProxy__Clusters__app__Destinations__d1__Address=/app", "error: ReverseProxy:Clusters:app:Destinations:d1:Address: '/app' is not an absolute http:// or https:// URL" },
        { "unreadable certificate", $"Tern__Tls__Certificates__main__CertificatePath=/nonexistent/tls.crt|Tern__Tls__Certificates__main__KeyPath={TestPki.ATest.KeyPath}", "error: Tern:Tls:Certificates:main:CertificatePath: cannot read '/nonexistent/tls.crt'" },
        { "unreadable key", $"Tern__Tls__Certificates__main__CertificatePath={TestPki.ATest.CertificatePath}|Tern__Tls__Certificates__main__KeyPath=/nonexistent/tls.key", "error: Tern:Tls:Certificates:main:KeyPath: cannot read '/nonexistent/tls.key'" },
        { "key of another certificate", $"Tern__Tls__Certificates__main__CertificatePath={TestPki.ATest.CertificatePath}|Tern__Tls__Certificates__main__KeyPath={TestPki.BTest.KeyPath}", $"error: Tern:Tls:Certificates:main:KeyPath: the key in '{TestPki.BTest.KeyPath}' does not match the certificate in '{TestPki.ATest.CertificatePath}'" },
        { "port out of range", "Tern__Https__Port=70000", "error: Tern:Https:Port: '70000' is not a port number (1-65535)" },
        { "port not a number", "Tern__Management__Port=nine", "error: Tern:Management:Port: 'nine' is not a port number (1-65535)" },
        { "bad duration", "Tern__Shutdown__DrainTimeout=soon", "error: Tern:Shutdown:DrainTimeout: 'soon' is not a positive duration" },
        { "duration that rounds to nothing", "Tern__Tls__HandshakeTimeout=0.00000001", "error: Tern:Tls:HandshakeTimeout: '0.00000001' is shorter than the minimum of 1 ms" },
        { "list given as one value and as a list", "Tern__Forwarding__TrustedProxies=127.0.0.1|Tern__Forwarding__TrustedProxies__0=10.0.0.0/8", "error: Tern:Forwarding:TrustedProxies: '127.0.0.1' is given as one value and Tern:Forwarding:TrustedProxies as a list elsewhere" },
        { "zero upstream idle timeout", "Tern__Forwarding__PooledConnectionIdleTimeout=0", "error: Tern:Forwarding:PooledConnectionIdleTimeout: '0' is not a positive duration" },
        { "unknown engine", "Tern__Tls__Engine=BoringSsl", "error: Tern:Tls:Engine: 'BoringSsl' is not a TLS engine" },
        { "duration too long", "Tern__Tls__HandshakeTimeout=99999999", "error: Tern:Tls:HandshakeTimeout: '99999999' is longer than the maximum of 1.00:00:00" },
        { "TERN_CONFIG in a missing folder", "TERN_CONFIG=/nonexistent/folder/tern.json", "error: TERN_CONFIG (/nonexistent/folder/tern.json): the folder does not exist" },
        { "TERN_CONFIG missing", "TERN_CONFIG=/tmp/tern-no-such-file.json", "error: TERN_CONFIG (/tmp/tern-no-such-file.json): the file does not exist" },
        { "ticket keys of the wrong size", "Tern__Tls__SessionTicketKeys=/etc/hostname", "error: Tern:Tls:SessionTicketKeys: '/etc/hostname' holds" },
        { "unknown client certificate mode", "Tern__Https__ClientCertificates__Mode=Sometimes", "error: Tern:Https:ClientCertificates:Mode: 'Sometimes' is not a client certificate mode; use None, Optional or Required" },
        { "client certificates without CAs", "Tern__Https__ClientCertificates__Mode=Required", "error: Tern:Https:ClientCertificates:TrustedCaPath: is required when Tern:Https:ClientCertificates:Mode is Required" },
        { "client CA file without certificates", "Tern__Https__ClientCertificates__Mode=Optional|Tern__Https__ClientCertificates__TrustedCaPath=/etc/hostname", "error: Tern:Https:ClientCertificates:TrustedCaPath: '/etc/hostname' holds no PEM certificate" },
        { "ticket keys a device", "Tern__Tls__SessionTicketKeys=/dev/zero", "error: Tern:Tls:SessionTicketKeys: cannot read '/dev/zero': it is a character device, not a regular file" },
        { "certificate a folder", $"Tern__Tls__Certificates__main__CertificatePath=/tmp|Tern__Tls__Certificates__main__KeyPath={TestPki.ATest.KeyPath}", "error: Tern:Tls:Certificates:main:CertificatePath: cannot read '/tmp': it is a folder, not a regular file" },
        { "TERN_CONFIG a device", "TERN_CONFIG=/dev/zero", "error: TERN_CONFIG (/dev/zero): it is a character device, not a regular file" },
        { "Kestrel limit out of range", "Kestrel__Limits__MaxRequestBodySize=-5", "error: Kestrel:Limits:MaxRequestBodySize: '-5' is out of range: Value must be null or a non-negative number." },
        { "Kestrel limit not a number", "Kestrel__Limits__Http2__MaxStreamsPerConnection=many", "error: Kestrel:Limits:Http2:MaxStreamsPerConnection: 'many' is not a whole number" },
        { "Kestrel limit misspelt", "Kestrel__Limits__MaxBodySize=1000", "error: Kestrel:Limits:MaxBodySize: is not one of Kestrel's limits (misspelt?)" },
        { "Kestrel limit out of range, with Kestrel's value line", "Kestrel__Limits__Http2__MaxStreamsPerConnection=0", "error: Kestrel:Limits:Http2:MaxStreamsPerConnection: '0' is out of range: A value greater than zero is required." },
        { "Kestrel limits refused together", "Kestrel__Limits__MaxRequestBufferSize=1000", "error: Kestrel:Limits:MaxRequestBufferSize: 1000 is smaller than Kestrel:Limits:MaxRequestLineSize (8192)" },
        { "Kestrel duration as a bare number", "Kestrel__Limits__KeepAliveTimeout=75", "error: Kestrel:Limits:KeepAliveTimeout: '75' is not a duration: write [d.]hh:mm:ss (00:01:15 for 75 seconds, 75.00:00:00 for 75 days)" },
        { "Kestrel duration NaN", "Kestrel__Limits__KeepAliveTimeout=NaN", "error: Kestrel:Limits:KeepAliveTimeout: 'NaN' is not a duration: write [d.]hh:mm:ss; .NET reads a bare number as days" },
        { "Kestrel limit that cannot be none", "Kestrel__Limits__KeepAliveTimeout=", "error: Kestrel:Limits:KeepAliveTimeout: is empty, which means no limit" },
        { "Kestrel HTTP/3 limit", "Kestrel__Limits__Http3__MaxRequestHeaderFieldSize=1", "error: Kestrel:Limits:Http3:MaxRequestHeaderFieldSize: Tern does not serve HTTP/3" },
        { "TERN_CONFIG a folder", "TERN_CONFIG=/tmp", "error: TERN_CONFIG (/tmp): it is a folder, not a regular file" },
        { "an empty variable over the shipped route, which stays", "ReverseProxy__Routes__default=", "error: ReverseProxy:Routes:default: a null or empty value in the environment (ReverseProxy__Routes__default) takes nothing away: sources are laid over each other key by key, and what config/appsettings.json sets under ReverseProxy:Routes:default stays in force; a route or cluster is replaced by one of the same name" },
        { "YARP value its reader cannot convert", "ReverseProxy__Clusters__app__HttpClient__SslProtocols__0=Tls9", "error: ReverseProxy:Clusters:app:HttpClient:SslProtocols:0: 'Tls9' is not a valid value: Requested value 'Tls9' was not found." },
        { "a catch-all route beside the shipped one", "ReverseProxy__Routes__mine__ClusterId=app|ReverseProxy__Routes__mine__Match__Path=/{**rest}", "error: ReverseProxy:Routes:mine:Match: matches the same requests as route 'default' (the same Path, Hosts, Methods, Headers, QueryParameters and Order), so the router could choose neither and would answer each of them 500" },
        { "YARP header encoding, which would re-encode header bytes", "ReverseProxy__Clusters__app__HttpClient__ResponseHeaderEncoding=utf-8", "error: ReverseProxy:Clusters:app:HttpClient:ResponseHeaderEncoding: is not supported by Tern, which passes header bytes to and from upstreams unchanged; remove it" },
        { "cluster idle timeout not a duration", "ReverseProxy__Clusters__app__Metadata__Tern.PooledConnectionIdleTimeout=soon", "error: ReverseProxy:Clusters:app:Metadata:Tern.PooledConnectionIdleTimeout: 'soon' is not a positive duration (hh:mm:ss, e.g. 00:00:30)" },
        { "cluster connect timeout not positive", "ReverseProxy__Clusters__app__Metadata__Tern.ConnectTimeout=00:00:00", "error: ReverseProxy:Clusters:app:Metadata:Tern.ConnectTimeout: '00:00:00' is not a positive duration (hh:mm:ss, e.g. 00:00:30)" },
        { "YARP duration as a bare number", "ReverseProxy__Clusters__app__HttpRequest__ActivityTimeout=30", "error: ReverseProxy:Clusters:app:HttpRequest:ActivityTimeout: '30' is not a duration: write [d.]hh:mm:ss (00:00:30 for 30 seconds, 30.00:00:00 for 30 days)" },
        { "YARP duration NaN", "ReverseProxy__Clusters__app__HttpRequest__ActivityTimeout=NaN", "error: ReverseProxy:Clusters:app:HttpRequest:ActivityTimeout: 'NaN' is not a duration: write [d.]hh:mm:ss; .NET reads a bare number as days" },
        { "YARP duration both a bare number and unreadable", "ReverseProxy__Clusters__app__HttpRequest__ActivityTimeout=1e9", "error: ReverseProxy:Clusters:app:HttpRequest:ActivityTimeout: '1e9' is not a duration: write [d.]hh:mm:ss; .NET reads a bare number as days" },
        { "Kestrel data rate half given", "Kestrel__Limits__MinRequestBodyDataRate__BytesPerSecond=100", "error: Kestrel:Limits:MinRequestBodyDataRate: needs both BytesPerSecond and GracePeriod" },
        { "session affinity with YARP's default policy, HashCookie", "ReverseProxy__Clusters__app__SessionAffinity__Enabled=true|ReverseProxy__Clusters__app__SessionAffinity__AffinityKeyName=aff", "error: ReverseProxy:Clusters:app:SessionAffinity:Policy: is required: YARP's default, HashCookie, is not supported by Tern; set Cookie or ArrCookie" },
        { "route body limit below -1", "ReverseProxy__Routes__default__MaxRequestBodySize=-5", "error: ReverseProxy:Routes:default:MaxRequestBodySize: '-5' is out of range: a number of bytes, or -1 for no limit" },
        { "a route's Path outside its Match, named after the problem it causes", "ReverseProxy__Routes__web__ClusterId=app|ReverseProxy__Routes__web__Path=/web/{**rest}", "warn: ReverseProxy:Routes:web:Path is not read by YARP 2.1 and is ignored (YARP reads it as Match:Path under ReverseProxy:Routes:web)" },
        { "a route's Path outside its Match, named after YARP's own refusal", "ReverseProxy__Routes__web__ClusterId=app|ReverseProxy__Routes__web__Order=5|ReverseProxy__Routes__web__Path=/web/{**rest}", "warn: ReverseProxy:Routes:web:Path is not read by YARP 2.1 and is ignored (YARP reads it as Match:Path under ReverseProxy:Routes:web)" },
        { "a route's Hosts given one value, which YARP would ignore", "ReverseProxy__Routes__default__Match__Hosts=admin.example.com", "error: ReverseProxy:Routes:default:Match:Hosts: is a list: YARP would ignore the value given to it, and the route would not match as written; give its items as ReverseProxy:Routes:default:Match:Hosts:0" },
        { "route host ASP.NET Core cannot match", "ReverseProxy__Routes__default__Match__Hosts__0=[::1]:8443", "error: ReverseProxy:Routes:default:Match:Hosts:0: '[::1]:8443': ASP.NET Core's host matching cannot match an IPv6 address" },
        { "path pattern the route does not capture", "ReverseProxy__Routes__default__Transforms__0__PathPattern=/v2/{**rest}", "error: ReverseProxy:Routes:default:Transforms:0:PathPattern: '/v2/{**rest}' uses {rest}, which ReverseProxy:Routes:default:Match:Path does not capture (it captures {catch-all}); YARP would leave it out of the path it sends, or send / where it is required" },
        { "destination address with a query", "ReverseProxy__Clusters__app__Destinations__d1__Address=http://127.0.0.1:8081/?x=1", "error: ReverseProxy:Clusters:app:Destinations:d1:Address: 'http://127.0.0.1:8081/?x=1' has a query (?x=1), which would be put before each request's path" },
        { "upstream activity timeout of zero, a 504 for every request", "ReverseProxy__Clusters__app__HttpRequest__ActivityTimeout=00:00:00", "error: ReverseProxy:Clusters:app:HttpRequest:ActivityTimeout: '00:00:00' comes to 0 ms, as YARP counts it" },
        { "transform setting a header name .NET's client refuses", "ReverseProxy__Routes__default__Transforms__0__RequestHeader=X:Tenant|ReverseProxy__Routes__default__Transforms__0__Set=acme", "error: ReverseProxy:Routes:default:Transforms:0:RequestHeader: 'X:Tenant' is not a header name" },
        { "prefix to remove ending with a slash, removed from no request", "ReverseProxy__Routes__api__ClusterId=app|ReverseProxy__Routes__api__Match__Path=/api/{**rest}|ReverseProxy__Routes__api__Transforms__0__PathRemovePrefix=/api/", "error: ReverseProxy:Routes:api:Transforms:0:PathRemovePrefix: '/api/' ends with '/'" },
        { "route constraint the router cannot resolve, a 500 for every request of every route", "ReverseProxy__Routes__items__ClusterId=app|ReverseProxy__Routes__items__Match__Path=/items/{id:number}", "error: ReverseProxy:Routes:items:Match:Path: '/items/{id:number}': 'number' in {id:number} is not one of ASP.NET Core's route constraints" },
        { "route output cache policy", "ReverseProxy__Routes__default__OutputCachePolicy=short", "error: ReverseProxy:Routes:default:OutputCachePolicy: is not supported by Tern, which caches no responses; remove it" },
        { "log level given to the section, not a category", "Logging__LogLevel=Warning", "error: Logging:LogLevel: 'Warning' is given to the section itself, which .NET ignores; name a category: Logging:LogLevel:Default=Warning" },
        { "console log format unknown", "Logging__Console__FormatterName=xml", "error: Logging:Console:FormatterName: 'xml' is not a console log format; use simple, json or systemd" },
        { "console log option not a boolean", "Logging__Console__FormatterOptions__IncludeScopes=maybe", "error: Logging:Console:FormatterOptions:IncludeScopes: 'maybe' is not true or false" },
        { "console log option not one of its names", "Logging__Console__QueueFullMode=Drop", "error: Logging:Console:QueueFullMode: 'Drop' is not one of Wait, DropWrite" },
        { "console log option .NET refuses", "Logging__Console__MaxQueueLength=0", "error: Logging:Console:MaxQueueLength: '0' is out of range (" },
        { "console timestamp format .NET cannot write", "Logging__Console__FormatterOptions__TimestampFormat=%", "error: Logging:Console:FormatterOptions:TimestampFormat: '%' is not a .NET date and time format" },
        { "client CA file missing", "Tern__Https__ClientCertificates__Mode=Optional|Tern__Https__ClientCertificates__TrustedCaPath=/nonexistent/ca.crt", "error: Tern:Https:ClientCertificates:TrustedCaPath: cannot read '/nonexistent/ca.crt'" },
    };

    [Theory]
    [MemberData(nameof(InvalidConfigurations))]
    public async Task InvalidConfiguration_ExitsNonZeroNamingTheKey(string name, string settings, string expectedLine)
    {
        var environment = FreePorts();
        foreach (var setting in settings.Split('|'))
        {
            var (key, value) = (setting[..setting.IndexOf('=', StringComparison.Ordinal)], setting[(setting.IndexOf('=', StringComparison.Ordinal) + 1)..]);
            environment[key] = value;
        }

        await using var tern = TernProcess.Start(environment);
        var exit = await tern.WaitForExitAsync(TimeSpan.FromSeconds(30));

        Assert.True(exit is not null and not 0, $"{name}: exit {exit}\n{tern.Output}");
        Assert.Contains(tern.Output.Split('\n'), line => line.StartsWith(expectedLine, StringComparison.Ordinal));
        // One line per problem (and per key ignored): no stack trace, no message running onto a second line.
        Assert.All(tern.Output.Split('\n').Where(l => l.Length > 0), line => Assert.True(line.StartsWith("error: ", StringComparison.Ordinal) || line.StartsWith("warn: ", StringComparison.Ordinal) || line.StartsWith("Tern did not start", StringComparison.Ordinal), line));
    }

    [Fact]
    public async Task InvalidConfiguration_EveryProblemGetsOneLine()
    {
        var environment = FreePorts();
        environment["Tern__Http__Port"] = "0";
        environment["ReverseProxy__Routes__default__ClusterId"] = "nope";
        environment["Logging__Console__LogLevel__Default"] = "Verbose";

        await using var tern = TernProcess.Start(environment);
        var exit = await tern.WaitForExitAsync(TimeSpan.FromSeconds(30));

        Assert.Equal(1, exit);
        var errors = tern.Output.Split('\n').Where(l => l.StartsWith("error: ", StringComparison.Ordinal)).ToList();
        Assert.Equal(3, errors.Count);
        Assert.Contains(errors, l => l.StartsWith("error: Logging:Console:LogLevel:Default: 'Verbose' is not a log level", StringComparison.Ordinal));
        Assert.Contains(errors, l => l.StartsWith("error: Tern:Http:Port: '0'", StringComparison.Ordinal));
        Assert.Contains(errors, l => l.StartsWith("error: ReverseProxy:Routes:default:ClusterId:", StringComparison.Ordinal));
    }

    /// <summary>Files and arguments Tern cannot use at all: one line naming each, never a stack trace.</summary>
    [Fact]
    [System.Runtime.Versioning.SupportedOSPlatform("linux")] // Tern runs on Linux
    public async Task UnusableFilesAndArguments_ExitNonZeroWithOneLineEach()
    {
        var folder = Directory.CreateTempSubdirectory("tern-unusable-").FullName;
        try
        {
            // A settings file Tern may not open (a ConfigMap mounted for another user). Tests run
            // as root, which reads any file: Tern runs without the capabilities that allow it.
            var unreadable = Path.Combine(folder, "unreadable.json");
            await File.WriteAllTextAsync(unreadable, "{}");
            File.SetUnixFileMode(unreadable, UnixFileMode.None);
            var environment = FreePorts();
            environment["TERN_CONFIG"] = unreadable;
            await AssertRefusedAsync(TernProcess.StartWithoutFileOverride(environment), $"error: TERN_CONFIG ({unreadable}): cannot be read: Access to the path '{unreadable}' is denied.");

            // A NUL character in a path (JSON can write one; no file name can hold it).
            var nul = Path.Combine(folder, "nul.json");
            await File.WriteAllTextAsync(nul, """{ "Tern": { "Tls": { "SessionTicketKeys": "/tmp/a\u0000b" } } }""");
            environment = FreePorts();
            environment["TERN_CONFIG"] = nul;
            await AssertRefusedAsync(TernProcess.Start(environment), "error: Tern:Tls:SessionTicketKeys: cannot read '/tmp/a\\u0000b': the path holds a NUL character");

            // A certificate file cut short after its leaf: the chain's second block is incomplete.
            var cut = Path.Combine(folder, "cut.crt");
            var second = await File.ReadAllTextAsync(TestPki.BTest.CertificatePath);
            await File.WriteAllTextAsync(cut, await File.ReadAllTextAsync(TestPki.ATest.CertificatePath) + "\n" + second[..300]);
            environment = FreePorts();
            environment["Tern__Tls__Certificates__main__CertificatePath"] = cut;
            environment["Tern__Tls__Certificates__main__KeyPath"] = TestPki.ATest.KeyPath;
            await AssertRefusedAsync(TernProcess.Start(environment), $"error: Tern:Tls:Certificates:main:CertificatePath: '{cut}' begins 2 PEM certificates but only 1 are complete");

            // A setting written with one dash, which .NET's command-line parser refuses.
            await AssertRefusedAsync(TernProcess.Start(FreePorts(), "-Tern:Https:Port=9443"), "error: command line: The short switch '-Tern:Https:Port=9443' is not defined");
        }
        finally
        {
            Directory.Delete(folder, recursive: true);
        }
    }

    private static async Task AssertRefusedAsync(TernProcess process, string expectedLine)
    {
        await using var tern = process;
        var exit = await tern.WaitForExitAsync(TimeSpan.FromSeconds(30));
        Assert.True(exit == 1, $"exit {exit}\n{tern.Output}");
        Assert.Contains(tern.Output.Split('\n'), line => line.StartsWith(expectedLine, StringComparison.Ordinal));
        Assert.All(tern.Output.Split('\n').Where(l => l.Length > 0), line => Assert.True(line.StartsWith("error: ", StringComparison.Ordinal) || line.StartsWith("Tern did not start", StringComparison.Ordinal), line));
    }

    [Fact]
    public async Task SettingsFileOverTheSizeLimit_ExitsNonZeroNamingIt()
    {
        var folder = Directory.CreateTempSubdirectory("tern-big-").FullName;
        var path = Path.Combine(folder, "tern.json");
        await File.WriteAllTextAsync(path, "{ \"padding\": \"" + new string('x', 5_000_000) + "\" }");
        var environment = FreePorts();
        environment["TERN_CONFIG"] = path;

        int? exit;
        string output;
        await using (var tern = TernProcess.Start(environment))
        {
            exit = await tern.WaitForExitAsync(TimeSpan.FromSeconds(30));
            output = tern.Output;
        }

        var size = new FileInfo(path).Length;
        Directory.Delete(folder, recursive: true);

        Assert.Equal(1, exit);
        Assert.Contains($"error: TERN_CONFIG ({path}): it holds {size:N0} bytes; Tern reads files of at most 4,194,304 bytes", output, StringComparison.Ordinal);
    }

    [Fact]
    public async Task PortInUse_ExitsNonZeroNamingTheKey()
    {
        using var squatter = new TcpListener(IPAddress.Loopback, FreePort.Next());
        squatter.Start();
        var port = ((IPEndPoint)squatter.LocalEndpoint).Port;
        var environment = FreePorts();
        environment["Tern__Management__Port"] = port.ToString(System.Globalization.CultureInfo.InvariantCulture);

        await using var tern = TernProcess.Start(environment);
        var exit = await tern.WaitForExitAsync(TimeSpan.FromSeconds(30));

        Assert.Equal(1, exit);
        Assert.Contains($"error: Tern:Management:Port: port {port} is already in use by another process\n", tern.Output, StringComparison.Ordinal);
    }

    /// <summary>
    /// The way a port is taken from Tern that no one listens on: the kernel gave it to an outgoing
    /// connection as its local end. The error says so and what to do.
    /// </summary>
    [Fact]
    public async Task PortHeldByAnOutgoingConnection_TheErrorNamesTheEphemeralRange()
    {
        using var server = new TcpListener(IPAddress.Loopback, FreePort.Next());
        server.Start();
        using var outgoing = new TcpClient();
        await outgoing.ConnectAsync(IPAddress.Loopback, ((IPEndPoint)server.LocalEndpoint).Port);
        var port = ((IPEndPoint)outgoing.Client.LocalEndPoint!).Port;
        var environment = FreePorts();
        environment["Tern__Https__Port"] = port.ToString(System.Globalization.CultureInfo.InvariantCulture);

        await using var tern = TernProcess.Start(environment);
        var exit = await tern.WaitForExitAsync(TimeSpan.FromSeconds(30));

        Assert.Equal(1, exit);
        var (first, last) = EphemeralRange();
        Assert.Contains(
            $"error: Tern:Https:Port: port {port} is already in use by another process; it lies in the kernel's ephemeral range {first}-{last}, "
            + $"where an outgoing connection may hold it: use a port below {first}, or reserve this one in net.ipv4.ip_local_reserved_ports\n",
            tern.Output,
            StringComparison.Ordinal);
    }

    [Fact]
    public async Task PortInTheEphemeralRange_StartsWithOneWarningNamingTheKey()
    {
        int port;
        using (var probe = new TcpListener(IPAddress.Loopback, 0))
        {
            // The kernel hands out a free port of its ephemeral range. Between here and Tern's bind
            // an outgoing connection of a parallel test could take it, but Linux gives bind(0) odd
            // ports and connect() even ones first, so that is unlikely.
            probe.Start();
            port = ((IPEndPoint)probe.LocalEndpoint).Port;
        }

        var environment = FreePorts();
        environment["Tern__Http__Port"] = port.ToString(System.Globalization.CultureInfo.InvariantCulture);

        await using var tern = TernProcess.Start(environment);
        await tern.WaitUntilServingAsync(int.Parse(environment["Tern__Management__Port"], System.Globalization.CultureInfo.InvariantCulture));

        var (first, last) = EphemeralRange();
        var warnings = tern.Output.Split('\n').Where(l => l.Contains("ephemeral range", StringComparison.Ordinal)).ToList();
        var warning = Assert.Single(warnings);
        Assert.Contains($"Tern:Http:Port: port {port} lies in the kernel's ephemeral range {first}-{last} (net.ipv4.ip_local_port_range)", warning, StringComparison.Ordinal);
        Assert.Contains($"use a port below {first}, or reserve this one in net.ipv4.ip_local_reserved_ports", warning, StringComparison.Ordinal);
    }

    private static (int First, int Last) EphemeralRange()
    {
        var ends = File.ReadAllText("/proc/sys/net/ipv4/ip_local_port_range").Split((char[])['\t', ' '], StringSplitOptions.RemoveEmptyEntries);
        return (int.Parse(ends[0], System.Globalization.CultureInfo.InvariantCulture), int.Parse(ends[1], System.Globalization.CultureInfo.InvariantCulture));
    }

    [Fact]
    public async Task EnvironmentVariables_OverrideShippedRoutesAndPorts()
    {
        await using var app = await TestUpstream.StartAsync("app");
        await using var other = await TestUpstream.StartAsync("other");
        var environment = FreePorts();
        environment["Tern__Demo__Enabled"] = "false";
        environment["ReverseProxy__Clusters__app__Destinations__d1__Address"] = app.Address.ToString();
        environment["ReverseProxy__Routes__extra__ClusterId"] = "other";
        environment["ReverseProxy__Routes__extra__Match__Path"] = "/extra/{**rest}";
        environment["ReverseProxy__Routes__extra__Transforms__0__PathRemovePrefix"] = "/extra";
        environment["ReverseProxy__Clusters__other__Destinations__d1__Address"] = other.Address.ToString();

        await using var tern = TernProcess.Start(environment);
        using var client = await ServingClientAsync(tern, environment);

        Assert.Equal("app", await client.GetStringAsync(new Uri("/name", UriKind.Relative)));
        Assert.Equal("other", await client.GetStringAsync(new Uri("/extra/name", UriKind.Relative)));

        // The meters, in Prometheus' text format, on the management port only.
        using var management = new HttpClient();
        using var scrape = await management.GetAsync(new Uri($"http://127.0.0.1:{environment["Tern__Management__Port"]}/metrics"));
        var metrics = await scrape.Content.ReadAsStringAsync();
        Assert.Equal("text/plain; version=0.0.4; charset=utf-8", scrape.Content.Headers.ContentType!.ToString());
        Assert.Contains("# TYPE kestrel_active_connections gauge", metrics, StringComparison.Ordinal);
        Assert.Contains("http_client_request_duration_seconds_bucket{", metrics, StringComparison.Ordinal);
        Assert.Contains("dotnet_gc_heap_total_allocated_bytes_total ", metrics, StringComparison.Ordinal);
        if (engine == Proxy.Tls.TlsEngines.OpenSsl)
        {
            Assert.Contains("tern_tls_handshakes_total{network_protocol_name=\"http/1.1\",tern_tls_handshake_result=\"success\",tls_cipher=\"TLS_AES_256_GCM_SHA384\",tls_protocol_version=\"1.3\",tls_resumed=\"false\"}", metrics, StringComparison.Ordinal);
            Assert.Contains("tern_tls_bytes_total{tern_tls_direction=\"encrypt\",tern_tls_path=\"direct\"}", metrics, StringComparison.Ordinal);
        }
    }

    [Fact]
    public async Task Sigterm_FinishesInFlightRequestThenExitsZero()
    {
        await using var app = await TestUpstream.StartAsync("app");
        var (tern, client, environment) = await StartInFrontOfAsync(app, ("Tern__Shutdown__DrainTimeout", "00:00:20"));
        await using var process = tern;
        using var https = client;
        var httpsPort = int.Parse(environment["Tern__Https__Port"], System.Globalization.CultureInfo.InvariantCulture);
        var seen = app.Requests;
        var inFlight = client.GetAsync(new Uri("/slow/5000", UriKind.Relative));
        await WaitForUpstreamAsync(app, seen, inFlight);

        tern.Terminate();
        Assert.False(inFlight.IsCompleted, "the request was no longer in flight when SIGTERM was sent");
        var late = await ConnectUntilRefusedAsync(httpsPort);

        using var response = await inFlight;
        Assert.Equal(SocketError.ConnectionRefused, late);
        Assert.Equal(HttpStatusCode.OK, response.StatusCode);
        Assert.Equal("slow done", await response.Content.ReadAsStringAsync());
        Assert.Equal(0, await tern.WaitForExitAsync(TimeSpan.FromSeconds(20)));
        Assert.Contains("draining in-flight requests for up to 00:00:20", tern.Output, StringComparison.Ordinal);
    }

    [Fact]
    public async Task Sigterm_RequestLongerThanDrainTimeout_IsCutAndProcessExitsZero()
    {
        await using var app = await TestUpstream.StartAsync("app");
        var (tern, client, _) = await StartInFrontOfAsync(app, ("Tern__Shutdown__DrainTimeout", "00:00:01"));
        await using var process = tern;
        using var https = client;
        var seen = app.Requests;
        var inFlight = client.GetAsync(new Uri("/slow/20000", UriKind.Relative));
        await WaitForUpstreamAsync(app, seen, inFlight);

        tern.Terminate();

        Assert.Equal(0, await tern.WaitForExitAsync(TimeSpan.FromSeconds(10)));
        await Assert.ThrowsAnyAsync<Exception>(() => inFlight);
        Assert.Contains("GET /slow/20000 was cut off: Tern:Shutdown:DrainTimeout ran out", tern.Output, StringComparison.Ordinal);
    }

    [Fact]
    public async Task ClientGoneBeforeResponse_IsLoggedAs499()
    {
        await using var app = await TestUpstream.StartAsync("app");
        var (tern, client, _) = await StartInFrontOfAsync(app);
        await using var process = tern;
        using var https = client;

        // The first request pays for the TLS handshake to a cold process; the client must go away
        // while the proxy waits on the upstream, not before the request has reached the proxy.
        Assert.Equal("app", await client.GetStringAsync(new Uri("/name", UriKind.Relative)));
        var seen = app.Requests;
        using var gone = new CancellationTokenSource();
        var request = client.GetAsync(new Uri("/slow/3000", UriKind.Relative), gone.Token);
        await WaitForUpstreamAsync(app, seen, request);
        await gone.CancelAsync();
        await Assert.ThrowsAnyAsync<OperationCanceledException>(() => request);

        await tern.WaitForOutputAsync("GET /slow/3000 returned 499: the client closed the connection before the response", TimeSpan.FromSeconds(20));
        Assert.DoesNotContain("returned 502", tern.Output, StringComparison.Ordinal);
        AssertNoSecondReport(tern);
    }

    [Fact]
    public async Task DeadUpstream_ShippedConfig_IsOneLogLineNamingClusterAndDestination()
    {
        await using var app = await TestUpstream.StartAsync("app");
        var deadPort = FreePort.Next();
        var (tern, client, _) = await StartInFrontOfAsync(app, ("ReverseProxy__Clusters__app__Destinations__d1__Address", $"http://127.0.0.1:{deadPort}/"));
        await using var process = tern;
        using var https = client;

        using var response = await client.GetAsync(new Uri("/anything", UriKind.Relative));

        Assert.Equal(HttpStatusCode.BadGateway, response.StatusCode);
        var line = await tern.WaitForOutputAsync("GET /anything returned 502: the upstream refused the connection (cluster 'app') (route default, cluster app, destination d1)", TimeSpan.FromSeconds(20));
        Assert.Matches(@"Z warn: Tern\.Proxy\.Forwarding\[301] => ConnectionId:[0-9A-Z]+ GET /anything", line); // the connection it came from (no trace: none is exported)
        AssertNoSecondReport(tern);
    }

    /// <summary>
    /// Affinity cookies Tern cannot decrypt (altered by the client, or set by another replica or
    /// before a restart): each request is served, YARP choosing a destination again, and the line
    /// YARP wrote for each at Error with the exception's stack, which any client could repeat at
    /// will, is one warning with the reason, at most one every 10 s.
    /// </summary>
    [Fact]
    public async Task AffinityCookieTernCannotDecrypt_Served_OneWarningWithoutStack()
    {
        await using var app = await TestUpstream.StartAsync("app");
        var (tern, client, _) = await StartInFrontOfAsync(
            app,
            ("ReverseProxy__Clusters__app__SessionAffinity__Enabled", "true"),
            ("ReverseProxy__Clusters__app__SessionAffinity__Policy", "Cookie"),
            ("ReverseProxy__Clusters__app__SessionAffinity__AffinityKeyName", "tern-affinity"));
        await using var process = tern;
        using var https = client;

        for (var i = 0; i < 5; i++)
        {
            using var request = new HttpRequestMessage(HttpMethod.Get, new Uri("/name", UriKind.Relative));
            request.Headers.Add("Cookie", $"tern-affinity=altered{i}"); // base64url, not Data Protection's
            using var response = await client.SendAsync(request);
            Assert.Equal(HttpStatusCode.OK, response.StatusCode);
        }

        var line = await tern.WaitForOutputAsync("The request affinity key decryption failed.");
        Assert.Contains("warn: Yarp.ReverseProxy.SessionAffinity.CookieSessionAffinityPolicy[38]", line, StringComparison.Ordinal);
        Assert.Contains("failed. The provided payload cannot be decrypted because it was not protected with this protection provider.", line, StringComparison.Ordinal);
        Assert.Contains("YARP picked a destination again. At most one such line every 10 s", line, StringComparison.Ordinal);
        Assert.Single(tern.Output.Split('\n'), l => l.Contains("affinity key decryption failed", StringComparison.Ordinal));
        AssertNoSecondReport(tern);
    }

    /// <summary>
    /// YARP's active health probes of dead destinations: one line for each with its reason, not a
    /// warning with the exception's whole stack at every probe (at most one a minute for each
    /// destination), and each destination's change of health as YARP writes it.
    /// </summary>
    [Fact]
    public async Task DeadDestination_ActiveHealthChecks_OneProbeLineWithItsReason_NoStack()
    {
        await using var app = await TestUpstream.StartAsync("app");
        var (dead, silent) = (FreePort.Next(), FreePort.Next());
        var (tern, _, _) = await StartInFrontOfAsync(
            app,
            ("ReverseProxy__Clusters__app__Destinations__d1__Address", $"http://127.0.0.1:{dead}/"),
            ("ReverseProxy__Clusters__app__Destinations__d2__Address", $"http://127.0.0.1:{silent}/"),
            ("ReverseProxy__Clusters__app__HealthCheck__Active__Enabled", "true"),
            ("ReverseProxy__Clusters__app__HealthCheck__Active__Interval", "00:00:00.200"));
        await using var process = tern;

        await tern.WaitForOutputAsync("Active health state of destination `d1` on cluster `app` is set to 'Unhealthy'.");
        await tern.WaitForOutputAsync("Active health state of destination `d2` on cluster `app` is set to 'Unhealthy'.");
        await Task.Delay(1500); // seven more probes of each
        // One line for each destination, each with its own reason.
        foreach (var (destination, port) in (ReadOnlySpan<(string, int)>)[("d1", dead), ("d2", silent)])
        {
            var probe = Assert.Single(tern.Output.Split('\n'), l => l.Contains($"Probing destination `{destination}` on cluster `app` failed.", StringComparison.Ordinal));
            Assert.Contains($"failed. Connection refused (127.0.0.1:{port}). At most one such line for each destination every 60 s", probe, StringComparison.Ordinal);
        }

        AssertNoSecondReport(tern);
    }

    /// <summary>
    /// Logs as JSON, .NET's own formatter (Logging__Console__FormatterName=json): one object per
    /// line, its timestamp RFC 3339 (the shipped format's trailing space, there for the simple
    /// formatter, left out), the line's fields apart, and the connection it came from.
    /// </summary>
    [Fact]
    public async Task DeadUpstream_JsonLogs_OneObjectPerLine_WithTheFieldsAndTheConnection()
    {
        await using var app = await TestUpstream.StartAsync("app");
        var (tern, client, _) = await StartInFrontOfAsync(
            app, ("ReverseProxy__Clusters__app__Destinations__d1__Address", $"http://127.0.0.1:{FreePort.Next()}/"), ("Logging__Console__FormatterName", "json"));
        await using var process = tern;
        using var https = client;

        using var response = await client.GetAsync(new Uri("/anything", UriKind.Relative));

        Assert.Equal(HttpStatusCode.BadGateway, response.StatusCode);
        var line = await tern.WaitForOutputAsync("GET /anything returned 502", TimeSpan.FromSeconds(20));
        using var json = JsonDocument.Parse(line);
        var root = json.RootElement;
        Assert.True(DateTimeOffset.TryParseExact(root.GetProperty("Timestamp").GetString(), "yyyy-MM-dd'T'HH:mm:ss.fff'Z'", CultureInfo.InvariantCulture, DateTimeStyles.AssumeUniversal, out _), line);
        Assert.Equal("Warning", root.GetProperty("LogLevel").GetString());
        Assert.Equal("Tern.Proxy.Forwarding", root.GetProperty("Category").GetString());
        Assert.Equal(502, root.GetProperty("State").GetProperty("Status").GetInt32());
        Assert.Equal("d1", root.GetProperty("State").GetProperty("Destination").GetString());
        Assert.Contains(root.GetProperty("Scopes").EnumerateArray(), scope => scope.TryGetProperty("ConnectionId", out var id) && id.GetString()!.Length > 0);
        Assert.All(tern.Output.Split('\n', StringSplitOptions.RemoveEmptyEntries), l => Assert.StartsWith("{", l, StringComparison.Ordinal)); // start-up lines too
    }

    /// <summary>
    /// The shipped config keeps ASP.NET Core's per-request hosting diagnostics off: at any level,
    /// they start an Activity and a logging scope for every request (about 15% of a small request's
    /// CPU). Tern exports no traces, so a client's traceparent reaches the upstream as the client
    /// sent it, parented on a span that exists, and Tern invents none of its own.
    /// </summary>
    [Fact]
    public async Task ShippedConfig_ClientTraceparent_ReachesUpstreamUnchanged_AndTernAddsNone()
    {
        await using var app = await TestUpstream.StartAsync("app");
        var (tern, client, _) = await StartInFrontOfAsync(app);
        await using var process = tern;
        using var https = client;
        const string Traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

        using var traced = new HttpRequestMessage(HttpMethod.Get, new Uri("/headers", UriKind.Relative));
        traced.Headers.Add("traceparent", Traceparent);
        using var tracedResponse = await client.SendAsync(traced);
        var withTrace = TestUpstream.ParseHeaders(await tracedResponse.Content.ReadAsStringAsync());
        var withoutTrace = TestUpstream.ParseHeaders(await client.GetStringAsync(new Uri("/headers", UriKind.Relative)));

        Assert.Equal(Traceparent, withTrace["traceparent"]);
        Assert.False(withoutTrace.ContainsKey("traceparent"), $"Tern added traceparent {withoutTrace.GetValueOrDefault("traceparent")}");
    }

    /// <summary>
    /// Tern's own line is the whole report of a forwarding error: YARP's warning for the same
    /// event (with its stack trace) is turned off in the shipped config.
    /// </summary>
    private static void AssertNoSecondReport(TernProcess tern)
    {
        Assert.DoesNotContain("Yarp.ReverseProxy.Forwarder.HttpForwarder", tern.Output, StringComparison.Ordinal);
        Assert.DoesNotContain("   at ", tern.Output, StringComparison.Ordinal);
    }

    /// <summary>The real process in front of app, with extra settings; serving when this returns.</summary>
    private async Task<(TernProcess Tern, HttpClient Client, Dictionary<string, string> Environment)> StartInFrontOfAsync(TestUpstream app, params (string Key, string Value)[] settings)
    {
        var environment = FreePorts();
        environment["Tern__Demo__Enabled"] = "false";
        environment["ReverseProxy__Clusters__app__Destinations__d1__Address"] = app.Address.ToString();
        foreach (var (key, value) in settings)
        {
            environment[key] = value;
        }

        var tern = TernProcess.Start(environment);
        var client = await ServingClientAsync(tern, environment);
        return (tern, client, environment);
    }

    /// <summary>Waits (up to 10 s) until app has received more than seen requests, so that request is in flight in the proxy.</summary>
    private static async Task WaitForUpstreamAsync(TestUpstream app, int seen, Task request)
    {
        var deadline = DateTime.UtcNow + TimeSpan.FromSeconds(10);
        while (app.Requests <= seen && !request.IsCompleted && DateTime.UtcNow < deadline)
        {
            await Task.Delay(20);
        }

        Assert.True(app.Requests > seen, $"the upstream did not receive the request (request completed: {request.IsCompleted})");
    }

    /// <summary>Connects every 50 ms until the port refuses, for up to 10 s; returns the last result.</summary>
    private static async Task<SocketError> ConnectUntilRefusedAsync(int port)
    {
        var deadline = DateTime.UtcNow + TimeSpan.FromSeconds(10);
        while (true)
        {
            // Closed again at once: a connection the listener still accepted must not hold up the drain.
            using var socket = new Socket(SocketType.Stream, ProtocolType.Tcp);
            SocketError result;
            try
            {
                await socket.ConnectAsync(IPAddress.Loopback, port);
                result = SocketError.Success;
            }
            catch (SocketException ex)
            {
                result = ex.SocketErrorCode;
            }

            if (result == SocketError.ConnectionRefused || DateTime.UtcNow >= deadline)
            {
                return result;
            }

            await Task.Delay(50);
        }
    }

    [Fact]
    public async Task ThreadPoolSpin_ZeroByDefault_TheOperatorsHexadecimalValueWins()
    {
        // The shipped runtimeconfig sets the limit (Tern.Proxy.csproj); the runtime reads the
        // environment variable first, as hexadecimal, so 46 is its own default of 70.
        var environment = FreePorts();
        await using (var tern = TernProcess.Start(environment))
        {
            await tern.WaitForOutputAsync("Idle thread-pool workers spin at most 0 times before they sleep (Tern's default; DOTNET_ThreadPool_UnfairSemaphoreSpinLimit, in hexadecimal, overrides it)");
        }

        environment = FreePorts();
        environment["DOTNET_ThreadPool_UnfairSemaphoreSpinLimit"] = "46";
        await using (var tern = TernProcess.Start(environment))
        {
            await tern.WaitForOutputAsync("Idle thread-pool workers spin at most 70 times before they sleep (DOTNET_ThreadPool_UnfairSemaphoreSpinLimit=46, read as hexadecimal)");
        }
    }

    [Fact]
    public async Task SocketEventThreads_OnByDefault_OffWhenTheOperatorSetsZero()
    {
        // Tern's default: the runtime's socket event threads serve the connections, one per core.
        // The runtime shows that it took the switch by starting one event thread per core instead
        // of one (the thread count is the runtime's, .NET 6 to 10; on one core both are 1).
        var environment = ToTheDemo(FreePorts());
        await using (var tern = TernProcess.Start(environment))
        {
            await ServeThroughTlsAsync(tern, environment);
            await tern.WaitForOutputAsync("Connections are served on the socket event threads, one per core (DOTNET_SYSTEM_NET_SOCKETS_INLINE_COMPLETIONS=1; 0 hands them to the thread pool)");
            Assert.Equal(Environment.ProcessorCount, EventThreads(tern.Id));
        }

        environment = ToTheDemo(FreePorts());
        environment["DOTNET_SYSTEM_NET_SOCKETS_INLINE_COMPLETIONS"] = "0";
        await using (var tern = TernProcess.Start(environment))
        {
            await ServeThroughTlsAsync(tern, environment);
            await tern.WaitForOutputAsync("Connections are handed to the thread pool (DOTNET_SYSTEM_NET_SOCKETS_INLINE_COMPLETIONS=0)");
            Assert.Equal(1, EventThreads(tern.Id));
        }

        Dictionary<string, string> ToTheDemo(Dictionary<string, string> environment)
        {
            environment["ReverseProxy__Clusters__app__Destinations__d1__Address"] = $"http://127.0.0.1:{environment["Tern__Demo__Port"]}/";
            return environment;
        }

        static async Task ServeThroughTlsAsync(TernProcess tern, Dictionary<string, string> environment)
        {
            using var client = await ServingClientAsync(tern, environment);
            using var response = await client.GetAsync(new Uri("/anything", UriKind.Relative));
            Assert.Equal(HttpStatusCode.OK, response.StatusCode);
        }

        static int EventThreads(int pid) => Directory.GetDirectories($"/proc/{pid}/task")
            .Count(task => File.ReadAllText(Path.Combine(task, "comm")).Trim() == ".NET Sockets");
    }

    /// <summary>
    /// YARP registers ASP.NET Core's Data Protection for its Cookie and CustomHeader session
    /// affinity, with a hosted service that made a key at every start: a key file in
    /// ~/.aspnet/DataProtection-Keys, and three warnings in a container whose home is read-only
    /// (the chart's), for a feature the shipped configuration does not use. The key is now made
    /// when an affinity cookie is first protected, and affinity still works.
    /// </summary>
    [Fact]
    public async Task DataProtection_MakesNoKeyAtStart_OnlyWhenAnAffinityCookieNeedsOne()
    {
        var home = Directory.CreateTempSubdirectory("tern-test-home-").FullName;
        try
        {
            var environment = FreePorts();
            environment["HOME"] = home;
            environment["ReverseProxy__Clusters__app__Destinations__d1__Address"] = $"http://127.0.0.1:{environment["Tern__Demo__Port"]}/";
            var keys = Path.Combine(home, ".aspnet", "DataProtection-Keys");
            await using (var tern = TernProcess.Start(environment))
            {
                using var client = await ServingClientAsync(tern, environment);
                using var response = await client.GetAsync(new Uri("/anything", UriKind.Relative));
                Assert.Equal(HttpStatusCode.OK, response.StatusCode);
                Assert.False(response.Headers.Contains("Set-Cookie"));
                Assert.False(Directory.Exists(keys), "a Data Protection key was made at start");
                Assert.DoesNotContain("DataProtection", tern.Output, StringComparison.Ordinal);
            }

            environment["ReverseProxy__Clusters__app__SessionAffinity__Enabled"] = "true";
            environment["ReverseProxy__Clusters__app__SessionAffinity__Policy"] = "Cookie";
            environment["ReverseProxy__Clusters__app__SessionAffinity__AffinityKeyName"] = "tern-affinity";
            await using (var tern = TernProcess.Start(environment))
            {
                using var client = await ServingClientAsync(tern, environment);
                Assert.False(Directory.Exists(keys), "a Data Protection key was made at start");
                using var response = await client.GetAsync(new Uri("/anything", UriKind.Relative));
                Assert.Equal(HttpStatusCode.OK, response.StatusCode);
                var cookie = Assert.Single(response.Headers.GetValues("Set-Cookie"));
                Assert.StartsWith("tern-affinity=", cookie, StringComparison.Ordinal);
                Assert.Single(Directory.GetFiles(keys, "key-*.xml"));

                // The cookie is read back: YARP sets it again only when it cannot unprotect it.
                using var again = new HttpRequestMessage(HttpMethod.Get, new Uri("/anything", UriKind.Relative));
                again.Headers.Add("Cookie", cookie[..cookie.IndexOf(';', StringComparison.Ordinal)]);
                using var affine = await client.SendAsync(again);
                Assert.Equal(HttpStatusCode.OK, affine.StatusCode);
                Assert.False(affine.Headers.Contains("Set-Cookie"));
            }
        }
        finally
        {
            Directory.Delete(home, recursive: true);
        }
    }

    /// <summary>Waits until the process serves, then gives a client of its HTTPS listener.</summary>
    private static async Task<HttpClient> ServingClientAsync(TernProcess tern, Dictionary<string, string> environment)
    {
        await tern.WaitUntilServingAsync(int.Parse(environment["Tern__Management__Port"], System.Globalization.CultureInfo.InvariantCulture));
        return TernInstance.CreateClient(int.Parse(environment["Tern__Https__Port"], System.Globalization.CultureInfo.InvariantCulture), "https", "localhost", null, null);
    }

    private Dictionary<string, string> FreePorts() => new()
    {
        ["Tern__Tls__Engine"] = engine,
        ["Tern__Https__Port"] = FreePort.Next().ToString(System.Globalization.CultureInfo.InvariantCulture),
        ["Tern__Http__Port"] = FreePort.Next().ToString(System.Globalization.CultureInfo.InvariantCulture),
        ["Tern__Management__Port"] = FreePort.Next().ToString(System.Globalization.CultureInfo.InvariantCulture),
        ["Tern__Demo__Port"] = FreePort.Next().ToString(System.Globalization.CultureInfo.InvariantCulture),
    };
}

public sealed class OpenSslProcessTests() : ProcessTests(Proxy.Tls.TlsEngines.OpenSsl);

public sealed class SslStreamProcessTests() : ProcessTests(Proxy.Tls.TlsEngines.SslStream);

/// <summary>The OpenSSL engine on a machine where its native library cannot be loaded.</summary>
public sealed class MissingNativeLibraryTests
{
    [Fact]
    public async Task OpenSslEngine_LibraryMissing_StopsWithOneLineSayingHowToFix()
    {
        // A copy of the build output without libtern_tls.so.
        var folder = Directory.CreateTempSubdirectory("tern-nolib-").FullName;
        foreach (var file in Directory.EnumerateFiles(AppContext.BaseDirectory, "*", SearchOption.AllDirectories).Where(f => !f.EndsWith("libtern_tls.so", StringComparison.Ordinal)))
        {
            var target = Path.Combine(folder, Path.GetRelativePath(AppContext.BaseDirectory, file));
            Directory.CreateDirectory(Path.GetDirectoryName(target)!);
            File.Copy(file, target);
        }

        await using var tern = TernProcess.StartFrom(folder, new Dictionary<string, string>
        {
            ["Tern__Tls__Engine"] = "OpenSsl",
            ["Tern__Https__Port"] = FreePort.Next().ToString(System.Globalization.CultureInfo.InvariantCulture),
            ["Tern__Http__Port"] = FreePort.Next().ToString(System.Globalization.CultureInfo.InvariantCulture),
            ["Tern__Management__Port"] = FreePort.Next().ToString(System.Globalization.CultureInfo.InvariantCulture),
            ["Tern__Demo__Port"] = FreePort.Next().ToString(System.Globalization.CultureInfo.InvariantCulture),
        });

        Assert.Equal(1, await tern.WaitForExitAsync(TimeSpan.FromSeconds(30)));
        var errors = tern.Output.Split('\n').Where(l => l.StartsWith("error: ", StringComparison.Ordinal)).ToList();
        var line = Assert.Single(errors);
        Assert.StartsWith("error: Tern:Tls:Engine: OpenSsl: libtern_tls.so or OpenSSL 3 (libssl.so.3) cannot be loaded", line, StringComparison.Ordinal);
        Assert.Contains("or set Tern:Tls:Engine=SslStream", line, StringComparison.Ordinal);
    }
}

/// <summary>The shipped configuration exactly as a newcomer runs it (default ports, default engine).</summary>
public sealed class ShippedDefaultsTests
{
    /// <summary>The README's run command: shipped config, default ports, the embedded demo upstream.</summary>
    [Fact]
    public async Task ShippedDefaults_DemoAnswersThroughTlsAndYarp()
    {
        // The default ports must be free, or another process would answer in Tern's place.
        var listening = System.Net.NetworkInformation.IPGlobalProperties.GetIPGlobalProperties().GetActiveTcpListeners().Select(l => l.Port).ToHashSet();
        Assert.DoesNotContain(listening, p => p is 8443 or 8080 or 9090 or 8081);
        await using var tern = TernProcess.Start(new Dictionary<string, string>());
        await tern.WaitUntilServingAsync(9090);

        // Logged once Kestrel serves, through the asynchronous console logger: it may trail /healthz.
        await tern.WaitForOutputAsync("Tern listening: HTTPS 8443, HTTP 8080 (redirects to HTTPS 8443), management 9090");

        var (exit, output) = await Tool.RunAsync("curl", ["-sS", "-k", "https://localhost:8443/anything?x=1", "-d", "hello", "-H", "X-Name: caf\u00e9"]);

        Assert.Equal(0, exit);
        using var echo = JsonDocument.Parse(output);
        Assert.Equal("tern-demo", echo.RootElement.GetProperty("server").GetString());
        Assert.Equal("POST", echo.RootElement.GetProperty("method").GetString());
        Assert.Equal("/anything", echo.RootElement.GetProperty("path").GetString());
        Assert.Equal("hello", echo.RootElement.GetProperty("body").GetString());
        Assert.Equal("https", echo.RootElement.GetProperty("headers").GetProperty("X-Forwarded-Proto").GetString());
        Assert.Equal("caf\u00e9", echo.RootElement.GetProperty("headers").GetProperty("x-name").GetString()); // sent as UTF-8 (over HTTP/2, so lower-case), echoed as such
        await tern.WaitForOutputAsync("serving a self-signed certificate for localhost");

        var (h2Exit, version) = await Tool.RunAsync("curl", ["-sS", "-k", "--http2", "-o", "/dev/null", "-w", "%{http_version}", "https://localhost:8443/anything"]);
        Assert.Equal(0, h2Exit);
        Assert.Equal("2", version.Trim());

        // A first start warns about one thing: the self-signed certificate. (Kestrel used to warn
        // that HTTP/2 was off on the HTTPS port, which was false: it only sees TLS it set up itself.)
        var warnings = tern.Output.Split('\n').Where(l => l.Contains(" warn: ", StringComparison.Ordinal)).ToList();
        Assert.All(warnings, w => Assert.Contains("serving a self-signed certificate", w, StringComparison.Ordinal));

        // Tern's own line names the listeners; Kestrel's would call the HTTPS port http://, since
        // the TLS is Tern's and not Kestrel's.
        Assert.DoesNotContain("Now listening on: http://[::]:8443", tern.Output, StringComparison.Ordinal);
    }
}
