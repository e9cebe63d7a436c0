using Microsoft.Extensions.Configuration;
using Tern.Proxy.Configuration;
using Tern.Proxy.Tls.OpenSsl;
using Tern.Tests.Infrastructure;

namespace Tern.Tests.Tls;

/// <summary>
/// A reload parses a certificate, and builds the OpenSSL engine's native contexts, again only when
/// what they come from changed: with 200 certificates, doing it all again cost about 0.4 CPU
/// seconds per reload, for a route's change as much as for a certificate's.
/// </summary>
/// <remarks>
/// Runs alone: the parsed certificates are kept per process, and a Tern loading its own set in a
/// parallel test drops the names it does not have (CertificateLoader.Forget).
/// </remarks>
[Collection(nameof(RunsAlone))]
public sealed class OpenSslEngineTests
{
    [Fact]
    public void ACertificateIsParsedAgainOnlyWhenItsFilesChanged()
    {
        var folder = Directory.CreateTempSubdirectory("tern-reuse-").FullName;
        try
        {
            var pair = TestPki.Create("reused", ["reused.test"], folder);
            var settings = new CertificateSettings($"reused-{Guid.NewGuid():N}", pair.CertificatePath, pair.KeyPath, ["reused.test"]);
            var first = Load(settings);
            Assert.Same(first, Load(settings)); // with its SslStream context
            var again = Load(settings with { Hosts = ["reused.test", "other.test"] });
            Assert.Same(first.Certificate, again.Certificate);
            Assert.Equal(["reused.test", "other.test"], again.Hosts);

            TestPki.Create("reused", ["reused.test"], folder); // renewed in place
            var renewed = Load(settings);
            Assert.NotSame(first.Certificate, renewed.Certificate);
            Assert.NotEqual(first.Certificate.Thumbprint, renewed.Certificate.Thumbprint);
            Assert.True(renewed.Certificate.HasPrivateKey);
        }
        finally
        {
            Directory.Delete(folder, recursive: true);
        }

        static Proxy.Tls.ServerCertificate Load(CertificateSettings settings)
        {
            var problems = new List<ConfigurationProblem>();
            var loaded = Proxy.Tls.CertificateLoader.Load(settings, "Tern:Tls:Certificates:reused", problems);
            Assert.True(loaded is not null, string.Join("; ", problems.Select(p => p.Message)));
            return loaded;
        }
    }

    [Fact]
    public void AReloadThatChangesNoTlsSetting_KeepsTheContexts_AnyChangeToThemBuildsNewOnes()
    {
        var engine = new OpenSslEngine();
        var first = engine.ServerFor(Load("/a/{**rest}", "b.test", TestPki.BTest));

        Assert.Same(first, engine.ServerFor(Load("/b/{**rest}", "b.test", TestPki.BTest))); // a route changed
        var moved = engine.ServerFor(Load("/b/{**rest}", "c.test", TestPki.BTest)); // a host moved
        Assert.NotSame(first, moved);
        var pair = TestPki.Create($"renewed-{Guid.NewGuid():N}", ["b.test", "c.test"]);
        var renewed = engine.ServerFor(Load("/b/{**rest}", "c.test", pair)); // a new certificate
        Assert.NotSame(moved, renewed);
        Assert.Same(renewed, engine.ServerFor(Load("/c/{**rest}", "c.test", pair)));

        // Other inputs of the contexts: the ticket keys and the client-certificate settings.
        var certificates = Load("/c/{**rest}", "c.test", pair).Certificates;
        var none = Proxy.Tls.ClientCertificateTrust.None;
        Assert.Equal(OpenSslEngine.Identity(certificates, new byte[80], none), OpenSslEngine.Identity(certificates, new byte[80], none));
        Assert.NotEqual(OpenSslEngine.Identity(certificates, new byte[80], none), OpenSslEngine.Identity(certificates, Enumerable.Repeat((byte)1, 80).ToArray(), none));
    }

    private static ConfigurationSnapshot Load(string routePath, string secondHost, PemPair second)
    {
        var values = new Dictionary<string, string?>
        {
            ["Tern:Tls:Certificates:a:CertificatePath"] = TestPki.ATest.CertificatePath,
            ["Tern:Tls:Certificates:a:KeyPath"] = TestPki.ATest.KeyPath,
            ["Tern:Tls:Certificates:a:Hosts:0"] = "a.test",
            ["Tern:Tls:Certificates:b:CertificatePath"] = second.CertificatePath,
            ["Tern:Tls:Certificates:b:KeyPath"] = second.KeyPath,
            ["Tern:Tls:Certificates:b:Hosts:0"] = secondHost,
            ["ReverseProxy:Routes:r:ClusterId"] = "app",
            ["ReverseProxy:Routes:r:Match:Path"] = routePath,
            ["ReverseProxy:Clusters:app:Destinations:d1:Address"] = "http://127.0.0.1:1/",
        };
        var snapshot = ConfigurationSnapshot.TryLoad(new ConfigurationBuilder().AddInMemoryCollection(values).Build(), out var problems);
        Assert.True(snapshot is not null, string.Join("; ", problems.Select(p => $"{p.Key}: {p.Message}")));
        return snapshot;
    }
}
