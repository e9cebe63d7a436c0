using System.Net;
using System.Security.Cryptography;
using System.Security.Cryptography.X509Certificates;
using Tern.Proxy.Tls;
using Tern.Tests.Infrastructure;

namespace Tern.Tests.Configuration;

/// <summary>
/// A reload that changes a start-only setting is accepted and logged as needing a restart. Until
/// that restart Tern runs on what it was started with, and the reloads after it must check and
/// serve against that, not against the value waiting for the restart.
/// </summary>
public sealed class RestartPendingTests
{
    [Fact]
    public async Task Reload_AfterAnEngineChangeAwaitingRestart_ChecksCertificatesWithTheRunningEngine()
    {
        await using var upstream = await TestUpstream.StartAsync("app");
        var config = TernConfig.To(TlsEngines.OpenSsl, upstream);
        await using var tern = await TernInstance.StartAsync(config);
        using var client = tern.CreateClient();

        config.Tls["Engine"] = TlsEngines.SslStream;
        await tern.RewriteConfigAsync(config.ToJson());
        await tern.Logs.WaitForAsync("Tern:Tls:Engine changed to SslStream; it is applied at start, restart Tern to apply it");
        await tern.Logs.WaitForAsync("Configuration reloaded");
        // Only the engine waits for the restart: the OpenSSL engine applies its handshake timeout at once.
        Assert.DoesNotContain(tern.Logs.Lines, l => l.Contains("Tern:Tls:HandshakeTimeout changed", StringComparison.Ordinal));

        // An RSA-1024 certificate: .NET loads it, OpenSSL (security level 2) refuses it. Accepted,
        // every handshake of the running OpenSSL engine would fail.
        var folder = Directory.CreateTempSubdirectory("tern-weak-").FullName;
        try
        {
            config.Certificates(("weak", Rsa1024(folder), []));
            var logged = tern.Logs.Count;
            await tern.RewriteConfigAsync(config.ToJson());
            await tern.Logs.WaitForAsync("Configuration reload rejected", after: logged);
            Assert.Contains(tern.Logs.Lines.Skip(logged), l => l.Contains("Tern:Tls:Certificates", StringComparison.Ordinal));
            Assert.Equal("app", await client.GetStringAsync(new Uri("/name", UriKind.Relative)));
        }
        finally
        {
            Directory.Delete(folder, recursive: true);
        }
    }

    [Fact]
    public async Task Reload_HttpsPortChangeAwaitingRestart_RedirectsStillPointAtTheBoundPort()
    {
        await using var upstream = await TestUpstream.StartAsync("app");
        var config = TernConfig.To(TlsEngines.OpenSsl, upstream);
        await using var tern = await TernInstance.StartAsync(config);
        using var plain = tern.CreatePlainClient(config.HttpPort);

        var bound = config.HttpsPort;
        config.Tern["Https"]!["Port"] = FreePort.Next();
        await tern.RewriteConfigAsync(config.ToJson());
        await tern.Logs.WaitForAsync("Tern:Https:Port changed to");
        await tern.Logs.WaitForAsync("Configuration reloaded");

        using var response = await plain.GetAsync(new Uri("/x", UriKind.Relative));
        Assert.Equal(HttpStatusCode.PermanentRedirect, response.StatusCode);
        Assert.Equal(new Uri($"https://localhost:{bound}/x"), response.Headers.Location);
    }

    private static PemPair Rsa1024(string folder)
    {
        using var key = RSA.Create(1024);
        var request = new CertificateRequest("CN=localhost", key, HashAlgorithmName.SHA256, RSASignaturePadding.Pkcs1);
        using var certificate = request.CreateSelfSigned(DateTimeOffset.UtcNow.AddDays(-1), DateTimeOffset.UtcNow.AddDays(30));
        var pair = new PemPair(Path.Combine(folder, "weak.crt"), Path.Combine(folder, "weak.key"), certificate.Thumbprint);
        File.WriteAllText(pair.KeyPath, key.ExportPkcs8PrivateKeyPem());
        File.WriteAllText(pair.CertificatePath, certificate.ExportCertificatePem());
        return pair;
    }
}
