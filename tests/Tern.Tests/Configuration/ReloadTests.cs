using System.Net;
using System.Security.Cryptography;
using System.Security.Cryptography.X509Certificates;
using Tern.Tests.Infrastructure;

namespace Tern.Tests.Configuration;

public abstract class ReloadTests(string engine) : IAsyncLifetime
{
    private TestUpstream _first = null!;
    private TestUpstream _second = null!;

    public async Task InitializeAsync()
    {
        _first = await TestUpstream.StartAsync("first");
        _second = await TestUpstream.StartAsync("second");
    }

    public async Task DisposeAsync()
    {
        await _first.DisposeAsync();
        await _second.DisposeAsync();
    }

    [Fact]
    public async Task Reload_AddsRoute_WhileLongDownloadOnOpenConnectionCompletes()
    {
        var config = new TernConfig(engine).Route("a", "first", "/a/{**rest}", PrefixRemoved("/a")).Cluster("first", [_first]);
        await using var tern = await TernInstance.StartAsync(config);
        using var downloader = tern.CreateClient();
        using var client = tern.CreateClient();

        // 40 chunks of 64 KB, one every 50 ms: about two seconds on the wire.
        using var download = await downloader.GetAsync(new Uri("/a/stream/40/50", UriKind.Relative), HttpCompletionOption.ResponseHeadersRead);
        var body = await download.Content.ReadAsStreamAsync();
        var received = new MemoryStream();
        var buffer = new byte[64 * 1024];
        received.Write(buffer, 0, await body.ReadAsync(buffer));

        config.Route("b", "second", "/b/{**rest}", PrefixRemoved("/b")).Cluster("second", [_second]);
        await tern.RewriteConfigAsync(config.ToJson());
        Assert.Equal("second", await EventuallyAsync(client, "/b/name", "second"));

        await body.CopyToAsync(received);
        Assert.Equal(40 * 64 * 1024, received.Length);
        var expected = new MemoryStream();
        for (var i = 0; i < 40; i++)
        {
            expected.Write(TestUpstream.Pattern(64 * 1024));
        }

        Assert.Equal(SHA256.HashData(expected.ToArray()), SHA256.HashData(received.ToArray()));
    }

    [Fact]
    public async Task Reload_InvalidChange_KeepsLastGoodConfiguration()
    {
        var config = new TernConfig(engine).Route("a", "first", "/a/{**rest}", PrefixRemoved("/a")).Cluster("first", [_first]);
        await using var tern = await TernInstance.StartAsync(config);
        using var client = tern.CreateClient();

        // A route to a cluster that does not exist, then a half-written file: both refused.
        var broken = new TernConfig(engine).Route("a", "first", "/a/{**rest}", PrefixRemoved("/a")).Route("b", "missing", "/b/{**rest}").Cluster("first", [_first]);
        await tern.RewriteConfigAsync(broken.ToJson());
        await Task.Delay(1000);
        Assert.Equal("first", await client.GetStringAsync(new Uri("/a/name", UriKind.Relative)));
        Assert.Equal(HttpStatusCode.NotFound, (await client.GetAsync(new Uri("/b/name", UriKind.Relative))).StatusCode);

        await tern.RewriteConfigAsync("{ \"ReverseProxy\": { \"Routes\": ");
        await Task.Delay(1000);
        Assert.Equal("first", await client.GetStringAsync(new Uri("/a/name", UriKind.Relative)));

        // A valid change after the broken ones is applied.
        config.Route("b", "second", "/b/{**rest}", PrefixRemoved("/b")).Cluster("second", [_second]);
        await tern.RewriteConfigAsync(config.ToJson());
        Assert.Equal("second", await EventuallyAsync(client, "/b/name", "second"));
    }

    [Fact]
    public async Task Reload_CertificateChange_AppliesToNewHandshakesOnly()
    {
        var config = new TernConfig(engine).Route("a", "first", "{**rest}").Cluster("first", [_first]);
        await using var tern = await TernInstance.StartAsync(config);
        X509Certificate2? kept = null;
        using var open = tern.CreateClient(certificateSeen: c => kept = c);
        await open.GetStringAsync(new Uri("/name", UriKind.Relative));
        Assert.Equal(TestPki.Localhost.Thumbprint, kept!.Thumbprint);

        config.Certificates(("default", TestPki.BTest, []));
        await tern.RewriteConfigAsync(config.ToJson());

        string? fresh = null;
        for (var i = 0; i < 100 && fresh != TestPki.BTest.Thumbprint; i++)
        {
            await Task.Delay(100);
            using var client = tern.CreateClient(certificateSeen: c => fresh = c.Thumbprint);
            await client.GetStringAsync(new Uri("/name", UriKind.Relative));
        }

        Assert.Equal(TestPki.BTest.Thumbprint, fresh);

        // The connection opened before the reload still serves, without a new handshake.
        kept = null;
        Assert.Equal("first", await open.GetStringAsync(new Uri("/name", UriKind.Relative)));
        Assert.Null(kept);
    }

    [Fact]
    public async Task Reload_CertificateFilesRenewedInPlace_NewHandshakesGetRenewedCertificate()
    {
        var folder = Directory.CreateTempSubdirectory("tern-renew-").FullName;
        var original = TestPki.Create("site", ["localhost"], folder);
        var config = new TernConfig(engine).Route("a", "first", "{**rest}").Cluster("first", [_first]).Certificates(("site", original, []));
        await using var tern = await TernInstance.StartAsync(config);

        // Same paths, new content: what cert-manager or a Secret rotation does.
        var renewed = TestPki.Create("site", ["localhost"], folder);

        string? seen = null;
        for (var i = 0; i < 100 && seen != renewed.Thumbprint; i++)
        {
            await Task.Delay(100);
            using var client = tern.CreateClient(certificateSeen: c => seen = c.Thumbprint);
            await client.GetStringAsync(new Uri("/name", UriKind.Relative));
        }

        Assert.NotEqual(original.Thumbprint, renewed.Thumbprint);
        Assert.Equal(renewed.Thumbprint, seen);
    }

    private static System.Text.Json.Nodes.JsonObject PrefixRemoved(string prefix) => new()
    {
        ["Transforms"] = new System.Text.Json.Nodes.JsonArray(new System.Text.Json.Nodes.JsonObject { ["PathRemovePrefix"] = prefix }),
    };

    private static async Task<string> EventuallyAsync(HttpClient client, string path, string expected)
    {
        var last = "";
        for (var i = 0; i < 100; i++)
        {
            using var response = await client.GetAsync(new Uri(path, UriKind.Relative));
            last = await response.Content.ReadAsStringAsync();
            if (last == expected)
            {
                return last;
            }

            await Task.Delay(100);
        }

        return last;
    }
}

public sealed class OpenSslReloadTests() : ReloadTests(Proxy.Tls.TlsEngines.OpenSsl);

public sealed class SslStreamReloadTests() : ReloadTests(Proxy.Tls.TlsEngines.SslStream);
