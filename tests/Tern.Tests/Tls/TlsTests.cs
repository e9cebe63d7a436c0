using System.Net;
using System.Security.Cryptography.X509Certificates;
using Tern.Tests.Infrastructure;

namespace Tern.Tests.Tls;

public abstract class TlsTests(string engine) : IAsyncLifetime
{
    private TestUpstream _upstream = null!;
    private TernInstance _tern = null!;

    public async Task InitializeAsync()
    {
        _upstream = await TestUpstream.StartAsync();
        var config = TernConfig.To(engine, _upstream).Certificates(
            ("default", TestPki.Localhost, []),
            ("a", TestPki.ATest, ["a.test"]),
            ("b", TestPki.BTest, ["B.Test"]),
            ("wild", TestPki.WildTest, ["*.wild.test"]),
            ("chained", TestPki.ChainedServer.Pair, ["chained.test"]));
        _tern = await TernInstance.StartAsync(config);
    }

    public async Task DisposeAsync()
    {
        await _tern.DisposeAsync();
        await _upstream.DisposeAsync();
    }

    [Theory]
    [InlineData("a.test", "a")]
    [InlineData("b.test", "b")]
    [InlineData("x.wild.test", "wild")]
    [InlineData("deep.x.wild.test", "default")]
    [InlineData("other.test", "default")]
    public async Task Sni_PicksCertificateByHost(string host, string expected)
    {
        X509Certificate2? seen = null;
        using var client = _tern.CreateClient(host: host, certificateSeen: c => seen = c);

        var name = await client.GetStringAsync(new Uri("/name", UriKind.Relative));

        Assert.Equal("up", name);
        Assert.Equal(Pki(expected).Thumbprint, seen!.Thumbprint);
    }

    [Theory]
    [InlineData("a.test", "a")]
    [InlineData("b.test", "b")]
    public async Task Sni_OpensslClient_ReceivesCertificateForServerName(string host, string expected)
    {
        var sent = await SentChainAsync(host);

        Assert.Equal(Pki(expected).Thumbprint, sent[0]);
    }

    [Fact]
    public async Task ServerChain_IntermediatesInTheFileAreSent_ALoneLeafGoesAlone()
    {
        var (chained, intermediate) = TestPki.ChainedServer;

        Assert.Equal([chained.Thumbprint, intermediate], await SentChainAsync("chained.test"));
        Assert.Equal([TestPki.ATest.Thumbprint], await SentChainAsync("a.test"));
    }

    [Theory]
    [InlineData("--http1.1", "HTTP/1.1")]
    [InlineData("--http2", "HTTP/2")]
    public async Task Curl_ThroughTls_GetsUpstreamResponse(string flag, string expectedVersion)
    {
        var (exit, output) = await Tool.RunAsync("curl", ["-sS", "-k", flag, "-i", "--resolve", $"a.test:{_tern.Config.HttpsPort}:127.0.0.1", $"https://a.test:{_tern.Config.HttpsPort}/name"]);

        Assert.Equal(0, exit);
        Assert.StartsWith($"{expectedVersion} 200", output, StringComparison.Ordinal);
        Assert.EndsWith("up", output, StringComparison.Ordinal);
    }

    [Fact]
    public async Task Curl_PostsBody_UpstreamEchoesIt()
    {
        var (exit, output) = await Tool.RunAsync("curl", ["-sS", "-k", "--data-binary", "tern says hello", $"https://127.0.0.1:{_tern.Config.HttpsPort}/echo"]);

        Assert.Equal(0, exit);
        Assert.Equal("tern says hello", output);
    }

    [Theory]
    [InlineData("-tls1_2", "TLSv1.2")]
    [InlineData("-tls1_3", "TLSv1.3")]
    public async Task Openssl_ModernProtocols_AreNegotiated(string flag, string protocol)
    {
        var (exit, output) = await Tool.RunAsync("openssl", ["s_client", "-connect", $"127.0.0.1:{_tern.Config.HttpsPort}", flag, "-servername", "a.test"], input: "Q\n");

        Assert.Equal(0, exit);
        Assert.Contains($"New, {protocol}, Cipher is", output, StringComparison.Ordinal);
    }

    [Fact]
    public async Task Openssl_Tls10_IsRefused()
    {
        var (exit, output) = await Tool.RunAsync("openssl", ["s_client", "-connect", $"127.0.0.1:{_tern.Config.HttpsPort}", "-tls1", "-cipher", "DEFAULT@SECLEVEL=0"], input: "Q\n");

        Assert.NotEqual(0, exit);
        Assert.Contains("alert protocol version", output, StringComparison.Ordinal);
        using var client = _tern.CreateClient();
        Assert.Equal(HttpStatusCode.OK, (await client.GetAsync(new Uri("/name", UriKind.Relative))).StatusCode);
    }

    [Fact]
    public async Task NoCertificateConfigured_GeneratesSelfSignedOnceAndKeepsIt()
    {
        var folder = Directory.CreateTempSubdirectory("tern-selfsigned-").FullName;
        var config = TernConfig.To(engine, _upstream);
        config.Tls.Remove("Certificates");
        config.Tls["SelfSignedDirectory"] = folder;

        string first;
        await using (var tern = await TernInstance.StartAsync(config))
        {
            X509Certificate2? seen = null;
            using var client = tern.CreateClient(certificateSeen: c => seen = c);
            Assert.Equal("up", await client.GetStringAsync(new Uri("/name", UriKind.Relative)));
            Assert.Equal("CN=localhost", seen!.Subject);
            first = seen.Thumbprint;
        }

        var again = TernConfig.To(engine, _upstream);
        again.Tern["Tls"] = config.Tls.DeepClone();
        await using (var tern = await TernInstance.StartAsync(again))
        {
            X509Certificate2? seen = null;
            using var client = tern.CreateClient(certificateSeen: c => seen = c);
            await client.GetStringAsync(new Uri("/name", UriKind.Relative));
            Assert.Equal(first, seen!.Thumbprint);
        }
    }

    /// <summary>The thumbprints of the certificates the server sent for this name, in order (openssl s_client -showcerts).</summary>
    private async Task<string[]> SentChainAsync(string host)
    {
        var (exit, output) = await Tool.RunAsync("openssl", ["s_client", "-connect", $"127.0.0.1:{_tern.Config.HttpsPort}", "-servername", host, "-showcerts"], input: "Q\n");
        Assert.Equal(0, exit);

        const string Begin = "-----BEGIN CERTIFICATE-----", End = "-----END CERTIFICATE-----";
        var sent = new List<string>();
        for (var at = output.IndexOf(Begin, StringComparison.Ordinal); at >= 0; at = output.IndexOf(Begin, at + 1, StringComparison.Ordinal))
        {
            using var certificate = X509Certificate2.CreateFromPem(output.AsSpan(at, output.IndexOf(End, at, StringComparison.Ordinal) + End.Length - at));
            sent.Add(certificate.Thumbprint);
        }

        return [.. sent];
    }

    private static PemPair Pki(string name) => name switch
    {
        "a" => TestPki.ATest,
        "b" => TestPki.BTest,
        "wild" => TestPki.WildTest,
        _ => TestPki.Localhost,
    };
}

public sealed class OpenSslTlsTests() : TlsTests(Proxy.Tls.TlsEngines.OpenSsl);

public sealed class SslStreamTlsTests() : TlsTests(Proxy.Tls.TlsEngines.SslStream);
