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

    /// <summary>PEM file of the CA that issues <see cref="TrustedClient"/> (for Tern:Https:ClientCertificates:TrustedCaPath).</summary>
    public static string ClientCaPath => s_clientPki.Value.CaPath;

    /// <summary>CN=client.test, for client authentication, issued by the CA in <see cref="ClientCaPath"/>.</summary>
    public static ClientIdentity TrustedClient => s_clientPki.Value.Trusted;

    /// <summary>CN=stranger.test, for client authentication, issued by a CA Tern is not told about.</summary>
    public static ClientIdentity UntrustedClient => s_clientPki.Value.Untrusted;

    private static readonly Lazy<(string CaPath, ClientIdentity Trusted, ClientIdentity Untrusted, X509Certificate2 Authority)> s_clientPki = new(() =>
    {
        var authority = CreateAuthority("Tern Test Client CA"); // kept: it issues intermediates later
        using var stranger = CreateAuthority("Some Other CA");
        var caPath = Path.Combine(s_folder.Value, "client-ca.crt");
        File.WriteAllText(caPath, authority.ExportCertificatePem());
        return (caPath, IssueClient("client.test", authority), IssueClient("stranger.test", stranger), authority);
    });

    /// <summary>
    /// A client certificate issued through an intermediate of the trusted client CA, whose
    /// "CA issuers" URL (AIA) is issuerUrl. Returns the leaf alone and, in ChainPath, the leaf
    /// followed by the intermediate; Intermediate is the intermediate's DER.
    /// </summary>
    public static (ClientIdentity Leaf, string ChainPath, byte[] Intermediate) ClientThroughIntermediate(string name, string issuerUrl)
    {
        var authority = s_clientPki.Value.Authority;
        using var intermediate = CreateAuthority($"{name} Intermediate CA", authority);
        var leaf = IssueClient(name, intermediate, issuerUrl);
        var chainPath = Path.Combine(s_folder.Value, $"{name}-chain.crt");
        File.WriteAllText(chainPath, File.ReadAllText(leaf.CertificatePath) + "\n" + intermediate.ExportCertificatePem() + "\n");
        return (leaf, chainPath, intermediate.RawData);
    }

    /// <summary>
    /// A server certificate for chained.test issued by an intermediate of a root CA, written as
    /// operators get it from their CA: the certificate file holds the leaf, then the intermediate
    /// (a "fullchain.pem"); the root is in no file.
    /// </summary>
    public static (PemPair Pair, string IntermediateThumbprint) ChainedServer => s_chainedServer.Value;

    private static readonly Lazy<(PemPair, string)> s_chainedServer = new(() =>
    {
        using var root = CreateAuthority("Tern Test Server Root CA");
        using var intermediate = CreateAuthority("Tern Test Server Intermediate CA", root);
        using var key = ECDsa.Create(ECCurve.NamedCurves.nistP256);
        using var leaf = ServerRequest(["chained.test"], key).Create(intermediate, DateTimeOffset.UtcNow.AddHours(-1), DateTimeOffset.UtcNow.AddDays(7), RandomNumberGenerator.GetBytes(8));
        var certificatePath = Path.Combine(s_folder.Value, "chained-fullchain.crt");
        var keyPath = Path.Combine(s_folder.Value, "chained.key");
        File.WriteAllText(certificatePath, leaf.ExportCertificatePem() + "\n" + intermediate.ExportCertificatePem() + "\n");
        File.WriteAllText(keyPath, key.ExportPkcs8PrivateKeyPem());
        return (new PemPair(certificatePath, keyPath, leaf.Thumbprint), intermediate.Thumbprint);
    });

    private static X509Certificate2 CreateAuthority(string name, X509Certificate2? issuer = null)
    {
        using var key = ECDsa.Create(ECCurve.NamedCurves.nistP256);
        var request = new CertificateRequest($"CN={name}", key, HashAlgorithmName.SHA256);
        request.CertificateExtensions.Add(new X509BasicConstraintsExtension(true, false, 0, true));
        request.CertificateExtensions.Add(new X509KeyUsageExtension(X509KeyUsageFlags.KeyCertSign | X509KeyUsageFlags.CrlSign, true));
        request.CertificateExtensions.Add(new X509SubjectKeyIdentifierExtension(request.PublicKey, false));
        if (issuer is null)
        {
            return request.CreateSelfSigned(DateTimeOffset.UtcNow.AddDays(-1), DateTimeOffset.UtcNow.AddDays(30));
        }

        using var issued = request.Create(issuer, DateTimeOffset.UtcNow.AddHours(-2), DateTimeOffset.UtcNow.AddDays(20), RandomNumberGenerator.GetBytes(8));
        return issued.CopyWithPrivateKey(key);
    }

    private static ClientIdentity IssueClient(string name, X509Certificate2 authority, string? issuerUrl = null)
    {
        using var key = ECDsa.Create(ECCurve.NamedCurves.nistP256);
        var request = new CertificateRequest($"CN={name}", key, HashAlgorithmName.SHA256);
        request.CertificateExtensions.Add(new X509EnhancedKeyUsageExtension([new Oid("1.3.6.1.5.5.7.3.2")], false));
        request.CertificateExtensions.Add(new X509KeyUsageExtension(X509KeyUsageFlags.DigitalSignature, true));
        if (issuerUrl is not null)
        {
            request.CertificateExtensions.Add(new X509AuthorityInformationAccessExtension(null, [issuerUrl]));
        }

        using var issued = request.Create(authority, DateTimeOffset.UtcNow.AddHours(-1), DateTimeOffset.UtcNow.AddDays(7), RandomNumberGenerator.GetBytes(8));
        var certificatePath = Path.Combine(s_folder.Value, $"{name}.crt");
        var keyPath = Path.Combine(s_folder.Value, $"{name}.key");
        File.WriteAllText(certificatePath, issued.ExportCertificatePem());
        File.WriteAllText(keyPath, key.ExportPkcs8PrivateKeyPem());
        return new ClientIdentity(certificatePath, keyPath, X509Certificate2.CreateFromPemFile(certificatePath, keyPath));
    }

    /// <summary>
    /// Writes a fresh certificate and key with the given names into folder. Each file is written
    /// beside its place and renamed over it (key first), as cert-manager and kubelet publish them:
    /// a proxy watching the folder never reads a half-written file. Valid for 30 days unless
    /// notAfter says otherwise; self-signed, or with intermediateNotAfter issued by an intermediate
    /// that expires then (before the leaf, if it is earlier, which a CA's own checks would not allow
    /// and a cross-signed intermediate can) and written after it in the certificate file.
    /// </summary>
    public static PemPair Create(string name, string[] dnsNames, string? folder = null, DateTimeOffset? notAfter = null, DateTimeOffset? intermediateNotAfter = null)
    {
        folder ??= s_folder.Value;
        using var key = ECDsa.Create(ECCurve.NamedCurves.nistP256);
        var request = ServerRequest(dnsNames, key);
        var notBefore = DateTimeOffset.UtcNow.AddDays(-1);
        var until = notAfter ?? DateTimeOffset.UtcNow.AddDays(30);
        string pem, thumbprint;
        if (intermediateNotAfter is { } intermediateUntil)
        {
            using var intermediateKey = ECDsa.Create(ECCurve.NamedCurves.nistP256);
            var intermediateRequest = new CertificateRequest($"CN={name} Intermediate", intermediateKey, HashAlgorithmName.SHA256);
            intermediateRequest.CertificateExtensions.Add(new X509BasicConstraintsExtension(true, false, 0, true));
            using var intermediate = intermediateRequest.CreateSelfSigned(notBefore, intermediateUntil);
            using var leaf = request.Create(intermediate.SubjectName, X509SignatureGenerator.CreateForECDsa(intermediateKey), notBefore, until, RandomNumberGenerator.GetBytes(8));
            pem = leaf.ExportCertificatePem() + "\n" + intermediate.ExportCertificatePem() + "\n";
            thumbprint = leaf.Thumbprint;
        }
        else
        {
            using var leaf = request.CreateSelfSigned(notBefore, until);
            pem = leaf.ExportCertificatePem();
            thumbprint = leaf.Thumbprint;
        }

        var certificatePath = Path.Combine(folder, $"{name}.crt");
        var keyPath = Path.Combine(folder, $"{name}.key");
        File.WriteAllText(keyPath + ".tmp", key.ExportPkcs8PrivateKeyPem());
        File.WriteAllText(certificatePath + ".tmp", pem);
        File.Move(keyPath + ".tmp", keyPath, overwrite: true);
        File.Move(certificatePath + ".tmp", certificatePath, overwrite: true);
        return new PemPair(certificatePath, keyPath, thumbprint);
    }

    /// <summary>A server certificate's request: CN the first name, and every name plus 127.0.0.1 as subject alternative names.</summary>
    private static CertificateRequest ServerRequest(string[] dnsNames, ECDsa key)
    {
        var request = new CertificateRequest($"CN={dnsNames[0]}", key, HashAlgorithmName.SHA256);
        var san = new SubjectAlternativeNameBuilder();
        foreach (var dns in dnsNames)
        {
            san.AddDnsName(dns);
        }

        san.AddIpAddress(IPAddress.Loopback);
        request.CertificateExtensions.Add(san.Build());
        return request;
    }
}

public sealed record PemPair(string CertificatePath, string KeyPath, string Thumbprint);

/// <summary>A client certificate (mTLS) on disk for curl and openssl, and in memory with its key for HttpClient.</summary>
public sealed record ClientIdentity(string CertificatePath, string KeyPath, X509Certificate2 Certificate);
