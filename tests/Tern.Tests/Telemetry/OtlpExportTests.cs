using System.Collections.Concurrent;
using System.Globalization;
using System.Net;
using System.Text;
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
/// real proxy pushes its metrics there over OTLP, as well as serving /metrics.
/// </summary>
public sealed class OtlpExportTests
{
    [Fact]
    public async Task OtlpEndpointSet_TernsAndThePlatformsMetricsArePushed()
    {
        var exports = new ConcurrentQueue<(string? ContentType, string Body)>();
        var builder = WebApplication.CreateSlimBuilder();
        builder.Logging.ClearProviders();
        builder.WebHost.UseKestrel(k => k.Listen(IPAddress.Loopback, 0));
        await using var collector = builder.Build();
        collector.MapPost("/v1/metrics", async context =>
        {
            using var body = new MemoryStream();
            await context.Request.Body.CopyToAsync(body);
            exports.Enqueue((context.Request.ContentType, Encoding.Latin1.GetString(body.ToArray()))); // protobuf: names are plain bytes
        });
        await collector.StartAsync();
        var address = collector.Services.GetRequiredService<IServer>().Features.Get<IServerAddressesFeature>()!.Addresses.Single();

        var (environment, https, management) = ExportingTo(address);
        await using var tern = TernProcess.Start(environment);
        await tern.WaitUntilServingAsync(management);
        using (var client = new HttpClient(new SocketsHttpHandler { SslOptions = { RemoteCertificateValidationCallback = delegate { return true; } } }))
        {
            using var response = await client.GetAsync(new Uri($"https://127.0.0.1:{https}/anything"));
            Assert.Equal(HttpStatusCode.OK, response.StatusCode); // through TLS and YARP to the demo
        }

        // An export after the request holds Tern's handshake counter and ASP.NET Core's request duration.
        var deadline = DateTime.UtcNow + TimeSpan.FromSeconds(30);
        while (!exports.Any(e => e.Body.Contains("tern.tls.handshakes", StringComparison.Ordinal) && e.Body.Contains("http.server.request.duration", StringComparison.Ordinal)))
        {
            Assert.True(DateTime.UtcNow < deadline, $"no export with both instruments in 30 s ({exports.Count} exports)\n{tern.Output}");
            await Task.Delay(100);
        }

        Assert.All(exports, e => Assert.Equal("application/x-protobuf", e.ContentType));
        Assert.Contains(exports, e => e.Body.Contains("service.name", StringComparison.Ordinal) && e.Body.Contains("\u0004tern", StringComparison.Ordinal)); // the string "tern", length-prefixed
    }

    /// <summary>A collector that cannot be reached: Tern serves on and says so, once a minute however often the exporter tries.</summary>
    [Fact]
    public async Task CollectorUnreachable_OneWarningNamingTheVariable_TernServesOn()
    {
        var dead = FreePort.Next();
        var (environment, _, management) = ExportingTo($"http://127.0.0.1:{dead}");
        await using var tern = TernProcess.Start(environment);
        await tern.WaitUntilServingAsync(management);

        const string Line = "OTLP metrics export (OTEL_EXPORTER_OTLP_ENDPOINT): ";
        await tern.WaitForOutputAsync(Line, TimeSpan.FromSeconds(20));
        await Task.Delay(2000); // six more failed exports
        var line = Assert.Single(tern.Output.Split('\n'), l => l.Contains(Line, StringComparison.Ordinal));
        Assert.Contains($"Connection refused (127.0.0.1:{dead})", line, StringComparison.Ordinal); // the collector, and why
        Assert.DoesNotContain(" at ", line[line.IndexOf(Line, StringComparison.Ordinal)..], StringComparison.Ordinal); // no stack

        using var client = new HttpClient();
        Assert.Equal(HttpStatusCode.OK, (await client.GetAsync(new Uri($"http://127.0.0.1:{management}/metrics"))).StatusCode);
    }

    /// <summary>The shipped configuration on free ports (the demo as its upstream), exporting to collector every 300 ms over OTLP/HTTP.</summary>
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
        };
        return (environment, https, management);
    }
}
