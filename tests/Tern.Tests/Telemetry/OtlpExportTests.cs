using System.Collections.Concurrent;
using System.Globalization;
using System.Net;
using System.Text;
using System.Text.Json;
using System.Text.RegularExpressions;
using Microsoft.AspNetCore.Builder;
using Microsoft.AspNetCore.Hosting;
using Microsoft.AspNetCore.Hosting.Server;
using Microsoft.AspNetCore.Hosting.Server.Features;
using Microsoft.AspNetCore.Http;
using Microsoft.Extensions.DependencyInjection;
using Tern.Tests.Infrastructure;

namespace Tern.Tests.Telemetry;

/// <summary>
/// Where OpenTelemetry's standard variables name a collector (OTEL_EXPORTER_OTLP_ENDPOINT), the
/// real proxy pushes its metrics there over OTLP, as well as serving /metrics, and its traces
/// where OTEL_TRACES_EXPORTER=otlp asks for them.
/// </summary>
public sealed class OtlpExportTests
{
    /// <summary>
    /// The endpoint alone pushes the metrics, not the traces (OTEL_TRACES_EXPORTER=otlp asks for
    /// them): no span is made, and a client's traceparent reaches the upstream as it was sent.
    /// </summary>
    [Fact]
    public async Task OtlpEndpointSet_TernsAndThePlatformsMetricsArePushed_NoTraces()
    {
        await using var collector = await Collector.StartAsync();
        var (tern, https, _) = await StartExportingAsync(collector.Address);
        await using var process = tern;
        using (var client = TrustingClient())
        {
            var traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
            Assert.Equal(traceparent, (await EchoedHeadersAsync(client, https, traceparent))["traceparent"]); // through TLS and YARP to the demo
        }

        // An export after the request holds Tern's handshake counter and ASP.NET Core's request duration.
        await collector.WaitForAsync("/v1/metrics", body => body.Contains("tern.tls.handshakes", StringComparison.Ordinal) && body.Contains("http.server.request.duration", StringComparison.Ordinal), tern);

        var metrics = collector.Exports.Where(e => e.Path == "/v1/metrics").ToList();
        Assert.All(metrics, e => Assert.Equal("application/x-protobuf", e.ContentType));
        Assert.Contains(metrics, e => e.Body.Contains("service.name", StringComparison.Ordinal) && e.Body.Contains("\u0004tern", StringComparison.Ordinal)); // the string "tern", length-prefixed
        Assert.DoesNotContain(collector.Exports, e => e.Path == "/v1/traces");
    }

    /// <summary>
    /// OTEL_TRACES_EXPORTER=otlp: each forwarded request is two spans, the client's request
    /// (named by method and route, with its outcome and YARP's route, cluster and destination)
    /// and the upstream call, in the client's trace, and the upstream receives Tern's upstream
    /// call as its parent. A request answered 5xx is an error span. Management probes, YARP's
    /// health probes and the demo upstream's side are not recorded.
    /// </summary>
    [Fact]
    public async Task TracesAsked_TheRequestsSpansArePushed_InTheClientsTrace()
    {
        await using var collector = await Collector.StartAsync();
        var (tern, https, _) = await StartExportingAsync( // waits on /healthz
            collector.Address,
            ("OTEL_TRACES_EXPORTER", "otlp"),
            ("OTEL_METRICS_EXPORTER", "none"),
            ("ReverseProxy__Routes__dead__ClusterId", "dead"),
            ("ReverseProxy__Routes__dead__Match__Path", "/dead/{**rest}"),
            ("ReverseProxy__Clusters__dead__Destinations__d1__Address", $"http://127.0.0.1:{FreePort.Next()}/"),
            ("ReverseProxy__Clusters__app__HealthCheck__Active__Enabled", "true"),
            ("ReverseProxy__Clusters__app__HealthCheck__Active__Interval", "00:00:00.200"),
            ("ReverseProxy__Clusters__app__HealthCheck__Active__Path", "/probe"));
        await using var process = tern;

        const string TraceId = "0af7651916cd43dd8448eb211c80319c";
        using var client = TrustingClient();
        var upstreamSaw = (await EchoedHeadersAsync(client, https, $"00-{TraceId}-b7ad6b7169203331-01"))["traceparent"];
        Assert.StartsWith($"00-{TraceId}-", upstreamSaw, StringComparison.Ordinal);
        Assert.DoesNotContain("b7ad6b7169203331", upstreamSaw, StringComparison.Ordinal); // Tern's span is the upstream's parent
        Assert.EndsWith("-01", upstreamSaw, StringComparison.Ordinal);

        var trace = Bytes(TraceId);
        var spanId = Bytes(upstreamSaw.Split('-')[2]);
        var export = await collector.WaitForAsync("/v1/traces", body => body.Contains(trace, StringComparison.Ordinal) && body.Contains("\u0011GET {**catch-all}", StringComparison.Ordinal) && body.Contains(spanId, StringComparison.Ordinal), tern);
        foreach (var text in (string[])["Microsoft.AspNetCore", "System.Net.Http", "http.response.status_code", Attribute("http.route", "{**catch-all}"), Attribute("url.path", "/anything"),
            Attribute("url.scheme", "https"), Attribute("proxy.route_id", "default"), Attribute("proxy.cluster_id", "app"), Attribute("proxy.destination_id", "d1"),
            Attribute("network.peer.address", "127.0.0.1"), Attribute("service.name", "tern")])
        {
            Assert.Contains(text, export, StringComparison.Ordinal);
        }

        Assert.DoesNotContain("Yarp.ReverseProxy", export, StringComparison.Ordinal); // two spans, not YARP's third

        // The upstream call is a child of the request's span, which is a child of the client's.
        var requestSpan = ParentOf(export, trace, spanId);
        Assert.Matches(Regex.Escape(Span(trace, requestSpan, Bytes("b7ad6b7169203331"))) + @".{0,8}\*\u0011GET \{\*\*catch-all}", export);

        // A request the upstream fails: the request's span is an error, named by its route, and
        // Tern's line for it names that span.
        const string DeadTraceId = "4bf92f3577b34da6a3ce929d0e0e4736";
        using (var request = new HttpRequestMessage(HttpMethod.Get, new Uri($"https://127.0.0.1:{https}/dead/x")))
        {
            request.Headers.Add("traceparent", $"00-{DeadTraceId}-00f067aa0ba902b7-01");
            using var response = await client.SendAsync(request);
            Assert.Equal(HttpStatusCode.BadGateway, response.StatusCode);
        }

        var deadExport = await collector.WaitForAsync("/v1/traces", body => body.Contains("\u0012GET /dead/{**rest}", StringComparison.Ordinal) && body.Contains(Attribute("error.type", "502"), StringComparison.Ordinal), tern);
        var line = await tern.WaitForOutputAsync("GET /dead/x returned 502");
        var logged = Regex.Match(line, "warn: Tern.Proxy.Forwarding\\[301] => SpanId:([0-9a-f]{16}), TraceId:([0-9a-f]{32}) => ConnectionId:[0-9A-Z]+ GET /dead/x returned 502: ");
        Assert.True(logged.Success, line);
        Assert.Equal(DeadTraceId, logged.Groups[2].Value);
        Assert.Matches(Regex.Escape(Span(Bytes(DeadTraceId), Bytes(logged.Groups[1].Value), Bytes("00f067aa0ba902b7"))) + @".{0,8}\*\u0012GET /dead/\{\*\*rest}", deadExport);

        // Not the proxy's requests: the kubelet's probes, YARP's active health probes (every
        // 200 ms here), the demo upstream's own side of each request (plain http).
        await Task.Delay(1000);
        await collector.WaitForAsync("/v1/traces", _ => true, tern);
        Assert.DoesNotContain(collector.Exports, e => e.Body.Contains("/healthz", StringComparison.Ordinal) || e.Body.Contains("/probe", StringComparison.Ordinal));
        Assert.DoesNotContain(collector.Exports, e => e.Body.Contains(Attribute("url.scheme", "http"), StringComparison.Ordinal));
        Assert.DoesNotContain(collector.Exports, e => e.Path == "/v1/metrics");
    }

    /// <summary>
    /// The sampler is OpenTelemetry's, from its variables: with a ratio of 0 a request that
    /// starts a trace is not recorded, but its trace still reaches the upstream, marked as not
    /// sampled (so the upstream's parent-based sampler records none of it either); a client's
    /// sampled trace is recorded whatever the ratio.
    /// </summary>
    [Fact]
    public async Task TracesAsked_TheSamplerDecides_AndTheUpstreamLearnsTheDecision()
    {
        await using var collector = await Collector.StartAsync();
        var (tern, https, _) = await StartExportingAsync(
            collector.Address, ("OTEL_TRACES_EXPORTER", "otlp"), ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"), ("OTEL_TRACES_SAMPLER_ARG", "0"));
        await using var process = tern;

        using var client = TrustingClient();
        var unsampled = (await EchoedHeadersAsync(client, https, null))["traceparent"];
        Assert.Matches("^00-[0-9a-f]{32}-[0-9a-f]{16}-00$", unsampled);
        const string TraceId = "4bf92f3577b34da6a3ce929d0e0e4736";
        await EchoedHeadersAsync(client, https, $"00-{TraceId}-00f067aa0ba902b7-01");

        await collector.WaitForAsync("/v1/traces", body => body.Contains(Bytes(TraceId), StringComparison.Ordinal), tern);
        var unsampledTrace = Bytes(unsampled.Split('-')[1]);
        Assert.DoesNotContain(collector.Exports, e => e.Body.Contains(unsampledTrace, StringComparison.Ordinal));
    }

    /// <summary>
    /// Trace settings Tern cannot use as written: one warning naming the variable, no traces
    /// (an unreadable ratio would otherwise record every request: the traceparent the upstream
    /// gets is the client's, which a span of Tern's would replace), and Tern serves on.
    /// </summary>
    [Theory]
    [InlineData("OTEL_TRACES_EXPORTER", "zipkin", null, "OTEL_TRACES_EXPORTER=zipkin not used: Tern pushes over OTLP only")]
    [InlineData("OTEL_TRACES_SAMPLER", "sometimes", null, "OTEL_TRACES_SAMPLER=sometimes not used: not one of always_on, ")]
    [InlineData("OTEL_TRACES_SAMPLER", "traceidratio", "1%", "OTEL_TRACES_SAMPLER_ARG=1% not used: traceidratio needs the share of traces to record, a number from 0 to 1")]
    [InlineData("OTEL_EXPORTER_OTLP_ENDPOINT", "", null, "OTEL_TRACES_EXPORTER=otlp not used: OTEL_EXPORTER_OTLP_ENDPOINT is not set (Tern reads no per-signal endpoint)")]
    public async Task TraceSettingTernCannotUse_OneWarningNamingIt_NoTraces(string variable, string value, string? ratio, string warning)
    {
        await using var collector = await Collector.StartAsync();
        var (tern, https, _) = await StartExportingAsync(
            collector.Address, ("OTEL_TRACES_EXPORTER", "otlp"), (variable, value), ("OTEL_TRACES_SAMPLER_ARG", ratio));
        await using var process = tern;
        using var client = TrustingClient();
        var traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        Assert.Equal(traceparent, (await EchoedHeadersAsync(client, https, traceparent))["traceparent"]); // no span of Tern's

        await tern.WaitForOutputAsync(warning);
        var line = Assert.Single(tern.Output.Split('\n'), l => l.Contains(warning, StringComparison.Ordinal));
        Assert.Contains("warn", line, StringComparison.Ordinal);
    }

    /// <summary>
    /// OTEL_EXPORTER_OTLP_HEADERS (an API key, a tenant) go with every export, read as the
    /// exporter reads them: URL-decoded, a trailing comma left alone.
    /// </summary>
    [Fact]
    public async Task OtlpHeaders_GoWithEachExport()
    {
        await using var collector = await Collector.StartAsync();
        var (tern, _, _) = await StartExportingAsync(collector.Address, ("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=acme%20corp,"));
        await using var process = tern;

        await collector.WaitForAsync("/v1/metrics", _ => true, tern);
        Assert.All(collector.Exports, e => Assert.Equal("acme corp", e.Tenant));
    }

    private const string HeadersWarning = "OTEL_EXPORTER_OTLP_HEADERS not used: the OTLP exporter cannot read it (write name=value entries separated by commas, each name once and a valid HTTP header name";

    /// <summary>
    /// Settings the exporter cannot be made with: headers it throws on while it is built (an
    /// empty entry between two, a name given twice, its own User-Agent), which ended Tern at start,
    /// or a name HTTP does not allow, on which every export failed; or a CA file that is not
    /// there. One warning naming the setting, never the headers' value (it holds a key as often as
    /// not), nothing pushed, neither metrics nor traces, and Tern serves on.
    /// </summary>
    [Theory]
    [InlineData("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=s3cret,,x-tenant=acme", HeadersWarning)]
    [InlineData("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=s3cret,x-api-key=s3cret2", HeadersWarning)]
    [InlineData("OTEL_EXPORTER_OTLP_HEADERS", "User-Agent=s3cret", HeadersWarning)]
    [InlineData("OTEL_EXPORTER_OTLP_HEADERS", "=s3cret", HeadersWarning)]
    [InlineData("OTEL_EXPORTER_OTLP_HEADERS", "x api key=s3cret", HeadersWarning)]
    [InlineData("OTEL_EXPORTER_OTLP_CERTIFICATE", "/nonexistent/ca.pem", "OTLP export off: the exporter cannot be made with the OTEL_ settings (CA Certificate file not found at path: /nonexistent/ca.pem), so nothing is pushed")]
    public async Task OtlpSettingsTheExporterCannotBeMadeWith_OneWarningWithoutTheHeaders_NothingPushed(string variable, string value, string warning)
    {
        await using var collector = await Collector.StartAsync();
        var (tern, https, _) = await StartExportingAsync(collector.Address, ("OTEL_TRACES_EXPORTER", "otlp"), (variable, value));
        await using var process = tern;
        using (var client = TrustingClient())
        {
            var traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
            Assert.Equal(traceparent, (await EchoedHeadersAsync(client, https, traceparent))["traceparent"]); // no span of Tern's
        }

        await tern.WaitForOutputAsync(warning);
        await Task.Delay(1000); // three metric intervals
        var line = Assert.Single(tern.Output.Split('\n'), l => l.Contains(warning, StringComparison.Ordinal));
        Assert.Contains("warn", line, StringComparison.Ordinal);
        Assert.DoesNotContain("s3cret", tern.Output, StringComparison.Ordinal);
        Assert.Empty(collector.Exports);
    }

    /// <summary>
    /// Values the SDK would throw on while it builds the exporter, ending Tern at start (a metric
    /// push interval of 0; an export timeout of 0, which it hands to HttpClient): one warning
    /// naming each, OpenTelemetry's default in its place, and the export goes on.
    /// </summary>
    [Theory]
    [InlineData("OTEL_METRIC_EXPORT_INTERVAL", "OTEL_METRIC_EXPORT_INTERVAL=0 not used: not a whole number of milliseconds above 0, so the metrics are pushed every 60000 ms (OpenTelemetry's default)")]
    [InlineData("OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT=0 not used: an export needs some time, so each waits up to 10000 ms (OpenTelemetry's default)")]
    [InlineData("otel_exporter_otlp_timeout", "OTEL_EXPORTER_OTLP_TIMEOUT=0 not used: an export needs some time, so each waits up to 10000 ms (OpenTelemetry's default)")] // the SDK reads names in any case
    public async Task ExporterValueTheSdkWouldThrowOn_OneWarningNamingIt_TheDefaultInstead(string variable, string warning)
    {
        await using var collector = await Collector.StartAsync();
        var (tern, https, _) = await StartExportingAsync(collector.Address, (variable, "0"), ("OTEL_TRACES_EXPORTER", "otlp")); // waits on /healthz
        await using var process = tern;

        using (var client = TrustingClient())
        {
            await EchoedHeadersAsync(client, https, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
        }

        await collector.WaitForAsync("/v1/traces", body => body.Contains(Bytes("0af7651916cd43dd8448eb211c80319c"), StringComparison.Ordinal), tern);
        Assert.Single(tern.Output.Split('\n'), l => l.Contains(warning, StringComparison.Ordinal));
    }

    /// <summary>
    /// OpenTelemetry's per-signal variables, which .NET's AddOtlpExporter does not read: alone, the
    /// metrics went nowhere without a word; beside the general endpoint, the signal went to the
    /// general one while the operator believed otherwise. One warning each, and the signals go
    /// where OTEL_EXPORTER_OTLP_ENDPOINT says, or nowhere without it.
    /// </summary>
    [Theory]
    [InlineData(false, "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT not used: Tern's exporter, OpenTelemetry .NET's AddOtlpExporter, reads OTEL_EXPORTER_OTLP_ENDPOINT for metrics and traces alike, and OTEL_EXPORTER_OTLP_ENDPOINT is not set, so nothing is pushed")]
    [InlineData(true, "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT not used: Tern's exporter, OpenTelemetry .NET's AddOtlpExporter, reads OTEL_EXPORTER_OTLP_ENDPOINT for metrics and traces alike (the collector's base address; over http/protobuf Tern adds /v1/metrics)")]
    public async Task PerSignalEndpoint_OneWarning_TheSignalGoesWhereTheGeneralOneSays(bool general, string warning)
    {
        await using var collector = await Collector.StartAsync();
        var (environment, _, management) = ExportingTo(collector.Address);
        environment["OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"] = general ? "http://127.0.0.1:1/v1/metrics" : collector.Address + "/v1/metrics";
        if (!general)
        {
            environment.Remove("OTEL_EXPORTER_OTLP_ENDPOINT");
        }

        await using var tern = TernProcess.Start(environment);
        await tern.WaitUntilServingAsync(management);

        await tern.WaitForOutputAsync(warning);
        if (general)
        {
            await collector.WaitForAsync("/v1/metrics", _ => true, tern);
        }
        else
        {
            await Task.Delay(1000); // three metric intervals
            Assert.Empty(collector.Exports);
        }

        Assert.Single(tern.Output.Split('\n'), l => l.Contains(warning, StringComparison.Ordinal));
    }

    /// <summary>A collector that cannot be reached: Tern serves on and says so, once a minute however often the exporter tries.</summary>
    [Fact]
    public async Task CollectorUnreachable_OneWarningNamingTheVariable_TernServesOn()
    {
        var dead = FreePort.Next();
        var (tern, _, management) = await StartExportingAsync($"http://127.0.0.1:{dead}");
        await using var process = tern;

        const string Line = "OTLP export (OTEL_EXPORTER_OTLP_ENDPOINT): ";
        await tern.WaitForOutputAsync(Line, TimeSpan.FromSeconds(20));
        await Task.Delay(2000); // six more failed exports
        var line = Assert.Single(tern.Output.Split('\n'), l => l.Contains(Line, StringComparison.Ordinal));
        Assert.Contains($"Connection refused (127.0.0.1:{dead})", line, StringComparison.Ordinal); // the collector, and why
        Assert.DoesNotContain(" at ", line[line.IndexOf(Line, StringComparison.Ordinal)..], StringComparison.Ordinal); // no stack

        using var client = new HttpClient();
        Assert.Equal(HttpStatusCode.OK, (await client.GetAsync(new Uri($"http://127.0.0.1:{management}/metrics"))).StatusCode);
    }

    /// <summary>The real process exporting to collector, with settings added to ExportingTo's (a null value adds none); serving when this returns.</summary>
    private static async Task<(TernProcess Tern, int Https, int Management)> StartExportingAsync(string collector, params (string Key, string? Value)[] settings)
    {
        var (environment, https, management) = ExportingTo(collector);
        foreach (var (key, value) in settings)
        {
            if (value is not null)
            {
                environment[key] = value;
            }
        }

        var tern = TernProcess.Start(environment);
        await tern.WaitUntilServingAsync(management);
        return (tern, https, management);
    }

    /// <summary>An id as its bytes appear in an export (protobuf bytes fields are the bytes as they are).</summary>
    private static string Bytes(string hex) => Encoding.Latin1.GetString(Convert.FromHexString(hex));

    /// <summary>The start of a span (OTLP Span: trace_id, span_id, parent_span_id) as its bytes appear in an export.</summary>
    private static string Span(string trace, string span, string parent) => $"\n\u0010{trace}\u0012\u0008{span}\"\u0008{parent}";

    /// <summary>The parent span id of span in the export.</summary>
    private static string ParentOf(string export, string trace, string span)
    {
        var match = Regex.Match(export, Regex.Escape($"\n\u0010{trace}\u0012\u0008{span}\"\u0008") + "(.{8})", RegexOptions.Singleline);
        Assert.True(match.Success, $"span {Convert.ToHexStringLower(Encoding.Latin1.GetBytes(span))} without a parent in the export");
        return match.Groups[1].Value;
    }

    /// <summary>An attribute (OTLP KeyValue) with a string value, as its bytes appear in an export.</summary>
    private static string Attribute(string key, string value) =>
        $"\n{(char)key.Length}{key}\u0012{(char)(value.Length + 2)}\n{(char)value.Length}{value}";

    private static HttpClient TrustingClient() =>
        new(new SocketsHttpHandler { SslOptions = { RemoteCertificateValidationCallback = delegate { return true; } } });

    /// <summary>The request headers the demo upstream received for a request sent with traceparent (none if null).</summary>
    private static async Task<Dictionary<string, string>> EchoedHeadersAsync(HttpClient client, int https, string? traceparent)
    {
        using var request = new HttpRequestMessage(HttpMethod.Get, new Uri($"https://127.0.0.1:{https}/anything"));
        if (traceparent is not null)
        {
            request.Headers.Add("traceparent", traceparent);
        }

        using var response = await client.SendAsync(request);
        Assert.Equal(HttpStatusCode.OK, response.StatusCode);
        using var echo = JsonDocument.Parse(await response.Content.ReadAsStringAsync());
        return echo.RootElement.GetProperty("headers").EnumerateObject().ToDictionary(h => h.Name, h => h.Value.GetString()!, StringComparer.OrdinalIgnoreCase);
    }

    /// <summary>An OTLP/HTTP collector on 127.0.0.1 that keeps every export it receives.</summary>
    private sealed class Collector : IAsyncDisposable
    {
        private readonly WebApplication _app;

        private Collector()
        {
            var builder = WebApplication.CreateSlimBuilder();
            builder.Logging.ClearProviders();
            builder.WebHost.UseKestrel(k => k.Listen(IPAddress.Loopback, 0));
            _app = builder.Build();
            _app.Run(async context =>
            {
                using var body = new MemoryStream();
                await context.Request.Body.CopyToAsync(body);
                Exports.Enqueue((context.Request.Path.Value!, context.Request.ContentType, Encoding.Latin1.GetString(body.ToArray()), context.Request.Headers["x-tenant"].ToString())); // protobuf: strings are plain bytes
            });
        }

        public string Address => _app.Services.GetRequiredService<IServer>().Features.Get<IServerAddressesFeature>()!.Addresses.Single();

        /// <summary>Each export: its path, content type, body and x-tenant header.</summary>
        public ConcurrentQueue<(string Path, string? ContentType, string Body, string Tenant)> Exports { get; } = new();

        public static async Task<Collector> StartAsync()
        {
            var collector = new Collector();
            await collector._app.StartAsync();
            return collector;
        }

        /// <summary>Waits up to 30 s until the exports to path so far, together (a span may come in a later batch than its parent), match; returns them.</summary>
        public async Task<string> WaitForAsync(string path, Func<string, bool> match, TernProcess tern)
        {
            var deadline = DateTime.UtcNow + TimeSpan.FromSeconds(30);
            while (true)
            {
                var bodies = string.Concat(Exports.Where(e => e.Path == path).Select(e => e.Body));
                if (bodies.Length > 0 && match(bodies))
                {
                    return bodies;
                }

                Assert.True(DateTime.UtcNow < deadline, $"no matching export to {path} in 30 s ({Exports.Count} exports)\n{tern.Output}");
                await Task.Delay(100);
            }
        }

        public ValueTask DisposeAsync() => _app.DisposeAsync();
    }

    /// <summary>The shipped configuration on free ports (the demo as its upstream), exporting to collector every 300 ms (metrics) and 200 ms (spans) over OTLP/HTTP.</summary>
    private static (Dictionary<string, string> Environment, int Https, int Management) ExportingTo(string collector)
    {
        string Text(int port) => port.ToString(CultureInfo.InvariantCulture);
        var (https, management, demo) = (FreePort.Next(), FreePort.Next(), FreePort.Next());
        var environment = new Dictionary<string, string>
        {
            ["Tern__Https__Port"] = Text(https),
            ["Tern__Http__Port"] = Text(FreePort.Next()),
            ["Tern__Management__Port"] = Text(management),
            ["Tern__Demo__Port"] = Text(demo),
            ["ReverseProxy__Clusters__app__Destinations__d1__Address"] = $"http://127.0.0.1:{demo}/",
            ["OTEL_EXPORTER_OTLP_ENDPOINT"] = collector,
            ["OTEL_EXPORTER_OTLP_PROTOCOL"] = "http/protobuf",
            ["OTEL_METRIC_EXPORT_INTERVAL"] = "300",
            ["OTEL_BSP_SCHEDULE_DELAY"] = "200",
        };
        return (environment, https, management);
    }
}
