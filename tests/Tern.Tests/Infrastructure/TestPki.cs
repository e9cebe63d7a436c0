using System.Net;
using System.Security.Cryptography;
using System.Security.Cryptography.X509Certificates;

namespace Tern.Tests.Infrastructure;

/// <summary>Certificates generated once per test run (never committed): ECDSA P-256, PEM on disk.</summary>
public static class TestPki
{
    private static readonly Lazy<string> s_folder = new(() => Directory.CreateTempSubdirectory("tern-pki-").FullName);
    private static readonly Dictionary<string, PemPair> s_cache = [];

    public static PemPair Localhost => Get("localhost", "localhost");

    public static PemPair ATest => Get("a", "a.test");

    public static PemPair BTest => Get("b", "b.test");

    public static PemPair WildTest => Get("wild", "*.wild.test");

    public static PemPair Get(string name, params string[] dnsNames)
    {
        lock (s_cache)
        {
            if (!s_cache.TryGetValue(name, out var pair))
            {
                pair = Create(name, dnsNames);
                s_cache[name] = pair;
            }

            return pair;
        }
    }

    /// <summary>Writes a fresh certificate and key with the given names into folder.</summary>
    public static PemPair Create(string name, string[] dnsNames, string? folder = null)
    {
        folder ??= s_folder.Value;
        using var key = ECDsa.Create(ECCurve.NamedCurves.nistP256);
        var request = new CertificateRequest($"CN={dnsNames[0]}", key, HashAlgorithmName.SHA256);
        var san = new SubjectAlternativeNameBuilder();
        foreach (var dns in dnsNames)
        {
            san.AddDnsName(dns);
        }

        san.AddIpAddress(IPAddress.Loopback);
        request.CertificateExtensions.Add(san.Build());
        using var certificate = request.CreateSelfSigned(DateTimeOffset.UtcNow.AddDays(-1), DateTimeOffset.UtcNow.AddDays(30));
        var certificatePath = Path.Combine(folder, $"{name}.crt");
        var keyPath = Path.Combine(folder, $"{name}.key");
        File.WriteAllText(certificatePath, certificate.ExportCertificatePem());
        File.WriteAllText(keyPath, key.ExportPkcs8PrivateKeyPem());
        return new PemPair(certificatePath, keyPath, certificate.Thumbprint);
    }
}

public sealed record PemPair(string CertificatePath, string KeyPath, string Thumbprint);
