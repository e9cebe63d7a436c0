using System.Text.Json.Nodes;
using Tern.Tests.Infrastructure;

namespace Tern.Tests.Telemetry;

/// <summary>What /metrics exports by default, and what Tern:Metrics:InFlight adds.</summary>
public sealed class MetricsTests
{
    // Prometheus names of the instruments updated on every request for what is in flight.
    private static readonly string[] InFlight =
    [
        "# TYPE http_server_active_requests ",
        "# TYPE http_client_active_requests ",
        "# TYPE http_client_open_connections ",
        "# TYPE http_client_request_time_in_queue_seconds ",
    ];

    [Fact]
    public async Task Default_ExportsRequestDurations_NotTheInFlightInstruments()
    {
        var metrics = await ScrapeAfterOneRequestAsync(inFlight: null);

        Assert.Contains("http_server_request_duration_seconds_bucket{", metrics, StringComparison.Ordinal);
        Assert.Contains("http_client_request_duration_seconds_bucket{", metrics, StringComparison.Ordinal);
        Assert.Contains("# TYPE kestrel_active_connections ", metrics, StringComparison.Ordinal);
        foreach (var name in InFlight)
        {
            Assert.DoesNotContain(name, metrics, StringComparison.Ordinal);
        }
    }

    [Fact]
    public async Task InFlightSetting_AddsTheInFlightInstruments()
    {
        var metrics = await ScrapeAfterOneRequestAsync(inFlight: true);

        Assert.Contains("http_server_request_duration_seconds_bucket{", metrics, StringComparison.Ordinal);
        foreach (var name in InFlight)
        {
            Assert.Contains(name, metrics, StringComparison.Ordinal);
        }
    }

    [Fact]
    public async Task InFlightSetting_NotABoolean_IsOneErrorNamingTheSetting()
    {
        var config = new TernConfig(Proxy.Tls.TlsEngines.OpenSsl);
        config.Tern["Metrics"] = new JsonObject { ["InFlight"] = "sometimes" };
        var error = await Assert.ThrowsAsync<InvalidOperationException>(() => TernInstance.StartAsync(config));

        Assert.Contains("error: Tern:Metrics:InFlight: 'sometimes' is not true or false", error.Message, StringComparison.Ordinal);
    }

    /// <summary>
    /// /metrics says when each certificate in force expires (Unix seconds, by name), for alerts
    /// before it does, with either engine: the earliest of the leaf and the intermediates sent
    /// with it. A reload's certificates replace the last ones, a renewed one's included. Tern runs as
    /// a process of its own (in a time zone other than UTC): Tern instances in one process would
    /// see each other's Tern.Tls meter.
    /// </summary>
    [Theory]
    [InlineData(Proxy.Tls.TlsEngines.OpenSsl)]
    [InlineData(Proxy.Tls.TlsEngines.SslStream)]
    public async Task CertificateExpiration_FollowsTheCertificatesInForce(string engine)
    {
        var folder = Directory.CreateTempSubdirectory("tern-expiry-").FullName;
        try
        {
            var config = new TernConfig(engine).Certificates(
                ("default", TestPki.Create("default", ["localhost"], folder, At("2030-06-01T00:00:00Z")), []),
                ("a", TestPki.Create("a", ["a.test"], folder, At("2031-01-02T03:04:05Z"), intermediateNotAfter: At("2029-07-08T09:10:11Z")), ["a.test"]));
            var file = Path.Combine(folder, "tern.json");
            await File.WriteAllTextAsync(file, config.ToJson());
            await using var tern = TernProcess.Start(new Dictionary<string, string> { ["TERN_CONFIG"] = file, ["TZ"] = "Asia/Kolkata" });
            await tern.WaitUntilServingAsync(config.ManagementPort);
            using var management = new HttpClient();
            var metrics = new Uri($"http://127.0.0.1:{config.ManagementPort}/metrics");

            // "a": its intermediate's date, which comes before its own.
            Assert.Equal([Line("a", "2029-07-08T09:10:11Z"), Line("default", "2030-06-01T00:00:00Z")], Lines(await management.GetStringAsync(metrics)));

            // "default" renewed (in files of their own, so that one write, the settings', makes one
            // reload), "a" replaced by "b".
            config.Certificates(("default", TestPki.Create("default-renewed", ["localhost"], folder, At("2032-02-03T04:05:06Z")), []),
                ("b", TestPki.Create("b", ["b.test"], folder, At("2033-03-04T05:06:07Z")), ["b.test"]));
            await File.WriteAllTextAsync(file, config.ToJson());
            await tern.WaitForOutputAsync("Configuration reloaded");

            Assert.Equal([Line("b", "2033-03-04T05:06:07Z"), Line("default", "2032-02-03T04:05:06Z")], Lines(await management.GetStringAsync(metrics)));
        }
        finally
        {
            Directory.Delete(folder, recursive: true);
        }

        static DateTimeOffset At(string utc) => DateTimeOffset.Parse(utc, System.Globalization.CultureInfo.InvariantCulture);

        static string Line(string name, string utc) =>
            $"tern_tls_certificate_expiration_timestamp_seconds{{tern_tls_certificate_name=\"{name}\"}} {At(utc).ToUnixTimeSeconds()}";

        static string[] Lines(string text) => [.. text.Split('\n').Where(l => l.StartsWith("tern_tls_certificate_expiration_timestamp_seconds{", StringComparison.Ordinal)).Order(StringComparer.Ordinal)];
    }

    private static async Task<string> ScrapeAfterOneRequestAsync(bool? inFlight)
    {
        await using var upstream = await TestUpstream.StartAsync();
        var config = TernConfig.To(Proxy.Tls.TlsEngines.OpenSsl, upstream);
        if (inFlight is not null)
        {
            config.Tern["Metrics"] = new JsonObject { ["InFlight"] = inFlight.Value };
        }

        await using var tern = await TernInstance.StartAsync(config);
        using var client = tern.CreateClient();
        using var response = await client.GetAsync(new Uri("/name", UriKind.Relative));
        response.EnsureSuccessStatusCode();
        using var management = new HttpClient();
        return await management.GetStringAsync(new Uri($"http://127.0.0.1:{config.ManagementPort}/metrics"));
    }
}
