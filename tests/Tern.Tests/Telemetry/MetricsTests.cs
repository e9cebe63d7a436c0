using System.Security.Cryptography.X509Certificates;
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
    /// before it does, with either engine; a reload's certificates replace the last ones. In a
    /// process of its own: Tern instances in one process would see each other's Tern.Tls meter.
    /// </summary>
    [Theory]
    [InlineData(Proxy.Tls.TlsEngines.OpenSsl)]
    [InlineData(Proxy.Tls.TlsEngines.SslStream)]
    public async Task CertificateExpiry_FollowsTheCertificatesInForce(string engine)
    {
        var config = new TernConfig(engine).Certificates(("default", TestPki.Localhost, []), ("a", TestPki.ATest, ["a.test"]));
        var file = Path.Combine(Directory.CreateTempSubdirectory("tern-expiry-").FullName, "tern.json");
        await File.WriteAllTextAsync(file, config.ToJson());
        await using var tern = TernProcess.Start(new Dictionary<string, string> { ["TERN_CONFIG"] = file });
        await tern.WaitUntilServingAsync(config.ManagementPort);
        using var management = new HttpClient();
        var metrics = new Uri($"http://127.0.0.1:{config.ManagementPort}/metrics");

        Assert.Equal([Expiry("a", TestPki.ATest), Expiry("default", TestPki.Localhost)], ExpiryLines(await management.GetStringAsync(metrics)));

        config.Certificates(("default", TestPki.Localhost, []), ("b", TestPki.BTest, ["b.test"]));
        await File.WriteAllTextAsync(file, config.ToJson());
        await tern.WaitForOutputAsync("Configuration reloaded");

        Assert.Equal([Expiry("b", TestPki.BTest), Expiry("default", TestPki.Localhost)], ExpiryLines(await management.GetStringAsync(metrics)));

        static string[] ExpiryLines(string text) => [.. text.Split('\n').Where(l => l.StartsWith("tern_tls_certificate_expiry_seconds{", StringComparison.Ordinal)).Order(StringComparer.Ordinal)];

        static string Expiry(string name, PemPair pair)
        {
            using var certificate = X509Certificate2.CreateFromPem(File.ReadAllText(pair.CertificatePath));
            return $"tern_tls_certificate_expiry_seconds{{tern_tls_certificate=\"{name}\"}} {new DateTimeOffset(certificate.NotAfter.ToUniversalTime()).ToUnixTimeSeconds()}";
        }
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
