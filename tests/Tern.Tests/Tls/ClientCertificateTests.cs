using System.Net;
using System.Text.Json;
using System.Text.Json.Nodes;
using Tern.Tests.Infrastructure;

namespace Tern.Tests.Tls;

/// <summary>
/// Mutual TLS on the HTTPS listener (Tern:Https:ClientCertificates), and the client certificate
/// forwarded to the upstream by YARP's ClientCert transform.
/// </summary>
public abstract class ClientCertificateTests(string engine) : IAsyncLifetime
{
    private TestUpstream _upstream = null!;

    public async Task InitializeAsync() => _upstream = await TestUpstream.StartAsync();

    public async Task DisposeAsync() => await _upstream.DisposeAsync();

    private TernConfig Config(string mode)
    {
        // The route forwards the client's certificate as base64 DER in X-Client-Cert.
        var config = new TernConfig(engine)
            .Route("all", "app", "{**catch-all}", new JsonObject { ["Transforms"] = new JsonArray(new JsonObject { ["ClientCert"] = "X-Client-Cert" }) })
            .Cluster("app", [_upstream]);
        if (mode != "None")
        {
            config.Tern["Https"]!["ClientCertificates"] = new JsonObject { ["Mode"] = mode, ["TrustedCaPath"] = TestPki.ClientCaPath };
        }

        return config;
    }

    // Each instance gets its own server name: .NET's client caches TLS sessions by name (not port)
    // and would otherwise resume, without a certificate, a session another test's proxy issued.
    private static HttpClient Client(TernInstance tern, Version? version = null, System.Security.Cryptography.X509Certificates.X509Certificate2? clientCertificate = null) =>
        tern.CreateClient(host: $"mtls-{tern.Config.HttpsPort}.test", version: version, clientCertificate: clientCertificate);

    private static async Task<string?> ForwardedCertificateAsync(HttpClient client)
    {
        using var request = new HttpRequestMessage(HttpMethod.Get, new Uri("/headers", UriKind.Relative));
        request.Headers.Add("X-Client-Cert", "forged by the client");
        using var response = await client.SendAsync(request);
        response.EnsureSuccessStatusCode();
        var headers = JsonSerializer.Deserialize<Dictionary<string, string>>(await response.Content.ReadAsStringAsync())!;
        return headers.GetValueOrDefault("X-Client-Cert");
    }

    [Theory]
    [InlineData("Required", "1.1")]
    [InlineData("Required", "2.0")]
    [InlineData("Optional", "1.1")]
    public async Task TrustedClientCertificate_IsAcceptedAndForwardedToUpstream(string mode, string version)
    {
        await using var tern = await TernInstance.StartAsync(Config(mode));
        using var client = Client(tern, version: Version.Parse(version), clientCertificate: TestPki.TrustedClient.Certificate);

        var forwarded = await ForwardedCertificateAsync(client);

        Assert.Equal(Convert.ToBase64String(TestPki.TrustedClient.Certificate.RawData), forwarded);
    }

    [Fact]
    public async Task Reconnect_ResumedSession_StillCarriesTheClientCertificate()
    {
        await using var tern = await TernInstance.StartAsync(Config("Required"));
        using var meter = new MeterReader(tern);
        var expected = Convert.ToBase64String(TestPki.TrustedClient.Certificate.RawData);
        for (var i = 0; i < 3; i++)
        {
            // A new client each time: a new connection, resuming the session of the one before.
            using var client = Client(tern, clientCertificate: TestPki.TrustedClient.Certificate);
            Assert.Equal(expected, await ForwardedCertificateAsync(client));
        }

        if (engine == Proxy.Tls.TlsEngines.OpenSsl)
        {
            Assert.True(meter.Total("tern.tls.handshakes", "tls.resumed=True") >= 1, "no connection resumed its session");
        }
    }

    [Fact]
    public async Task Optional_ClientWithoutCertificate_IsServedAndCannotForgeTheHeader()
    {
        await using var tern = await TernInstance.StartAsync(Config("Optional"));
        using var client = Client(tern);

        Assert.Null(await ForwardedCertificateAsync(client));
    }

    [Fact]
    public async Task None_ClientCertificateIsNotAskedFor()
    {
        await using var tern = await TernInstance.StartAsync(Config("None"));
        using var client = Client(tern, clientCertificate: TestPki.TrustedClient.Certificate);

        Assert.Null(await ForwardedCertificateAsync(client));
    }

    [Fact]
    public async Task Required_ClientWithoutCertificate_IsRefusedCountedAndLogged()
    {
        await using var tern = await TernInstance.StartAsync(Config("Required"));
        using var meter = new MeterReader(tern);
        using var refused = Client(tern);

        await Assert.ThrowsAsync<HttpRequestException>(() => refused.GetStringAsync(new Uri("/name", UriKind.Relative)));

        var line = await tern.Logs.WaitForAsync("TLS client certificate refused");
        Assert.Contains("Tern:Https:ClientCertificates", line, StringComparison.Ordinal);
        if (engine == Proxy.Tls.TlsEngines.OpenSsl)
        {
            Assert.Equal(1, meter.Total("tern.tls.handshakes", "error.type=client_certificate"));
        }

        // Only that connection failed.
        using var trusted = Client(tern, clientCertificate: TestPki.TrustedClient.Certificate);
        Assert.Equal("up", await trusted.GetStringAsync(new Uri("/name", UriKind.Relative)));
    }

    [Theory]
    [InlineData("Required")]
    [InlineData("Optional")]
    public async Task UntrustedClientCertificate_IsRefusedWithReason(string mode)
    {
        await using var tern = await TernInstance.StartAsync(Config(mode));
        using var client = Client(tern, clientCertificate: TestPki.UntrustedClient.Certificate);

        await Assert.ThrowsAsync<HttpRequestException>(() => client.GetStringAsync(new Uri("/name", UriKind.Relative)));

        var line = await tern.Logs.WaitForAsync("TLS client certificate refused");
        Assert.Contains(engine == Proxy.Tls.TlsEngines.OpenSsl ? "unable to get local issuer certificate" : "stranger.test", line, StringComparison.Ordinal);
    }

    [Theory]
    [InlineData("-tls1_2")]
    [InlineData("-tls1_3")]
    public async Task OpensslClient_WithCertificate_IsForwardedOnEachTlsVersion(string version)
    {
        await using var tern = await TernInstance.StartAsync(Config("Required"));
        var request = "GET /headers HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";

        // The exit code is not checked: Kestrel's SslStream closes without close_notify, which
        // s_client reports as an error after the response has arrived.
        var (_, output) = await Tool.RunAsync("openssl", ["s_client", "-connect", $"127.0.0.1:{tern.Config.HttpsPort}", version, "-quiet", "-ign_eof",
            "-cert", TestPki.TrustedClient.CertificatePath, "-key", TestPki.TrustedClient.KeyPath], input: request);

        Assert.StartsWith("HTTP/1.1 200", output, StringComparison.Ordinal);
        Assert.Contains(Convert.ToBase64String(TestPki.TrustedClient.Certificate.RawData), output, StringComparison.Ordinal);
    }

    [Fact]
    public async Task Curl_WithoutCertificate_FailsTheHandshakeOnRequired()
    {
        await using var tern = await TernInstance.StartAsync(Config("Required"));

        var (refused, _) = await Tool.RunAsync("curl", ["-sS", "-k", $"https://127.0.0.1:{tern.Config.HttpsPort}/name"]);
        var (exit, output) = await Tool.RunAsync("curl", ["-sS", "-k", "--cert", TestPki.TrustedClient.CertificatePath, "--key", TestPki.TrustedClient.KeyPath, $"https://127.0.0.1:{tern.Config.HttpsPort}/name"]);

        Assert.NotEqual(0, refused);
        Assert.Equal(0, exit);
        Assert.Equal("up", output);
    }

    [Fact]
    public async Task Intermediates_OnlyThoseTheClientSendsCount_NoneAreFetched()
    {
        // The leaf names, as where to fetch its issuer, a listener that would serve it.
        using var fetches = new TcpIssuerServer();
        var (leaf, chainPath, intermediate) = TestPki.ClientThroughIntermediate($"chain-{engine}.test", $"http://127.0.0.1:{fetches.Port}/issuer.crt");
        fetches.Serve(intermediate);
        await using var tern = await TernInstance.StartAsync(Config("Required"));
        var url = $"https://127.0.0.1:{tern.Config.HttpsPort}/name";

        var (withChain, output) = await Tool.RunAsync("curl", ["-sS", "-k", "--cert", chainPath, "--key", leaf.KeyPath, url]);
        var (leafOnly, _) = await Tool.RunAsync("curl", ["-sS", "-k", "--cert", leaf.CertificatePath, "--key", leaf.KeyPath, url]);

        Assert.True(withChain == 0, $"curl exit {withChain}: {output}");
        Assert.Equal("up", output);
        Assert.NotEqual(0, leafOnly);
        Assert.Equal(0, fetches.Connections);
    }

    [Fact]
    public async Task Reload_TurningClientCertificatesOn_AppliesToNewHandshakes()
    {
        var config = Config("None");
        await using var tern = await TernInstance.StartAsync(config);
        using var before = Client(tern);
        Assert.Equal("up", await before.GetStringAsync(new Uri("/name", UriKind.Relative)));

        await tern.RewriteConfigAsync(WithPorts(Config("Required"), config).ToJson());
        await tern.Logs.WaitForAsync("Configuration reloaded");

        // The connection opened before the reload carries on; new ones need a certificate.
        Assert.Equal("up", await before.GetStringAsync(new Uri("/name", UriKind.Relative)));
        using var without = Client(tern);
        await Assert.ThrowsAsync<HttpRequestException>(() => without.GetStringAsync(new Uri("/name", UriKind.Relative)));
        using var with = Client(tern, clientCertificate: TestPki.TrustedClient.Certificate);
        Assert.Equal(Convert.ToBase64String(TestPki.TrustedClient.Certificate.RawData), await ForwardedCertificateAsync(with));
    }

    private static TernConfig WithPorts(TernConfig changed, TernConfig original)
    {
        foreach (var (listener, port) in new[] { ("Https", original.HttpsPort), ("Http", original.HttpPort), ("Management", original.ManagementPort) })
        {
            changed.Tern[listener]!["Port"] = port;
        }

        return changed;
    }
}

public sealed class OpenSslClientCertificateTests() : ClientCertificateTests(Proxy.Tls.TlsEngines.OpenSsl);

public sealed class SslStreamClientCertificateTests() : ClientCertificateTests(Proxy.Tls.TlsEngines.SslStream);

/// <summary>Counts connections to the URL a certificate names for its issuer, and serves the issuer.</summary>
internal sealed class TcpIssuerServer : IDisposable
{
    private readonly System.Net.Sockets.TcpListener _listener = new(System.Net.IPAddress.Loopback, 0);
    private int _connections;

    public TcpIssuerServer() => _listener.Start();

    public int Port => ((System.Net.IPEndPoint)_listener.LocalEndpoint).Port;

    public int Connections => Volatile.Read(ref _connections);

    public void Serve(byte[] issuer) => _ = Task.Run(async () =>
    {
        while (true)
        {
            using var client = await _listener.AcceptTcpClientAsync();
            Interlocked.Increment(ref _connections);
            var stream = client.GetStream();
            await stream.ReadAtLeastAsync(new byte[4096], 1, throwOnEndOfStream: false);
            var head = System.Text.Encoding.ASCII.GetBytes($"HTTP/1.1 200 OK\r\nContent-Type: application/pkix-cert\r\nContent-Length: {issuer.Length}\r\nConnection: close\r\n\r\n");
            await stream.WriteAsync(head);
            await stream.WriteAsync(issuer);
        }
    });

    public void Dispose() => _listener.Stop();
}
