using System.Net;
using System.Security.Cryptography;
using System.Security.Cryptography.X509Certificates;
using Tern.Proxy.Configuration;

namespace Tern.Proxy.Tls;

/// <summary>
/// The certificate served when none is configured: ECDSA P-256 for localhost, 127.0.0.1 and ::1,
/// generated once and kept on disk so that clients that pinned it keep working across restarts.
/// </summary>
internal static class SelfSignedCertificate
{
    public const string Name = "self-signed";

    /// <summary>Returns settings for the kept certificate, creating it first if missing or about to expire.</summary>
    public static CertificateSettings Ensure(string directory)
    {
        var certificatePath = Path.Combine(directory, "localhost.crt");
        var keyPath = Path.Combine(directory, "localhost.key");
        if (!IsUsable(certificatePath, keyPath))
        {
            Create(directory, certificatePath, keyPath);
        }

        return new CertificateSettings(Name, certificatePath, keyPath, []);
    }

    private static bool IsUsable(string certificatePath, string keyPath)
    {
        if (!File.Exists(certificatePath) || !File.Exists(keyPath))
        {
            return false;
        }

        try
        {
            using var certificate = X509Certificate2.CreateFromPemFile(certificatePath, keyPath);
            return certificate.NotAfter > DateTime.Now.AddDays(7);
        }
        catch (CryptographicException)
        {
            return false;
        }
    }

    private static void Create(string directory, string certificatePath, string keyPath)
    {
        Directory.CreateDirectory(directory);
        using var key = ECDsa.Create(ECCurve.NamedCurves.nistP256);
        var request = new CertificateRequest("CN=localhost", key, HashAlgorithmName.SHA256);
        var names = new SubjectAlternativeNameBuilder();
        names.AddDnsName("localhost");
        names.AddIpAddress(IPAddress.Loopback);
        names.AddIpAddress(IPAddress.IPv6Loopback);
        request.CertificateExtensions.Add(names.Build());
        request.CertificateExtensions.Add(new X509BasicConstraintsExtension(false, false, 0, true));
        request.CertificateExtensions.Add(new X509KeyUsageExtension(X509KeyUsageFlags.DigitalSignature, true));
        request.CertificateExtensions.Add(new X509EnhancedKeyUsageExtension([new Oid("1.3.6.1.5.5.7.3.1")], false));
        using var certificate = request.CreateSelfSigned(DateTimeOffset.UtcNow.AddMinutes(-5), DateTimeOffset.UtcNow.AddYears(1));

        // Write the key first with owner-only permissions, then publish both by rename.
        var keyTemp = keyPath + ".tmp";
        File.WriteAllText(keyTemp, string.Empty);
        if (!OperatingSystem.IsWindows())
        {
            File.SetUnixFileMode(keyTemp, UnixFileMode.UserRead | UnixFileMode.UserWrite);
        }

        File.WriteAllText(keyTemp, key.ExportPkcs8PrivateKeyPem());
        File.WriteAllText(certificatePath + ".tmp", certificate.ExportCertificatePem());
        File.Move(keyTemp, keyPath, overwrite: true);
        File.Move(certificatePath + ".tmp", certificatePath, overwrite: true);
    }
}
