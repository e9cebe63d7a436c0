using System.Security.Cryptography;
using System.Security.Cryptography.X509Certificates;
using Tern.Proxy.Configuration;

namespace Tern.Proxy.Tls;

/// <summary>
/// Loads a PEM certificate and key (the layout of a Kubernetes TLS secret) and says precisely
/// which file is wrong and how when it cannot.
/// </summary>
internal static class CertificateLoader
{
    /// <summary>Certificates as one PEM text, in order (for OpenSSL).</summary>
    public static byte[] ToPem(IEnumerable<X509Certificate2> certificates)
    {
        var pem = new System.Text.StringBuilder();
        foreach (var certificate in certificates)
        {
            pem.Append(certificate.ExportCertificatePem()).Append('\n');
        }

        return System.Text.Encoding.ASCII.GetBytes(pem.ToString());
    }

    /// <summary>
    /// Why a PEM bundle holds fewer certificates than it begins, or null when every one was read:
    /// ImportFromPem skips a block cut short (a file caught half-written, a truncated chain) without
    /// a word, and Tern would serve a leaf without its chain, or trust fewer CAs.
    /// </summary>
    public static string? Incomplete(string pem, int imported, string path)
    {
        const string begin = "-----BEGIN CERTIFICATE-----";
        var begun = 0;
        for (var at = pem.IndexOf(begin, StringComparison.Ordinal); at >= 0; at = pem.IndexOf(begin, at + begin.Length, StringComparison.Ordinal))
        {
            begun++;
        }

        return begun > imported ? $"'{path}' begins {begun} PEM certificates but only {imported} are complete; the file is cut short (still being written?)" : null;
    }

    // The last certificate parsed under each name, with a digest of the two files' text it came
    // from. A reload reads every file again, to see a renewal, but parses only what changed: with
    // 200 certificates, parsing them all again (and building their SslStream contexts) was about
    // half of every reload's CPU, a route's change as much as a certificate's. Names a load no
    // longer has are dropped (Forget), so a removed certificate's key is not kept.
    private static readonly System.Collections.Concurrent.ConcurrentDictionary<string, (byte[] Digest, ServerCertificate Certificate)> s_parsed = new();

    public static ServerCertificate? Load(CertificateSettings settings, string keyPrefix, List<ConfigurationProblem> problems)
    {
        var certificateKey = $"{keyPrefix}:CertificatePath";
        var keyKey = $"{keyPrefix}:KeyPath";
        var certificateText = ReadText(settings.CertificatePath, certificateKey, problems);
        var keyText = ReadText(settings.KeyPath, keyKey, problems);
        if (certificateText is null || keyText is null)
        {
            return null;
        }

        var digest = Digest(certificateText, keyText);
        if (s_parsed.TryGetValue(settings.Name, out var parsed) && CryptographicOperations.FixedTimeEquals(parsed.Digest, digest))
        {
            // The same files: the same certificate, and with the same hosts the same object, whose
            // SslStream context (built with it) is kept too.
            var same = parsed.Certificate;
            if (!same.Hosts.SequenceEqual(settings.Hosts))
            {
                same = new ServerCertificate(settings.Name, same.Certificate, same.Chain, settings.Hosts);
                s_parsed[settings.Name] = (digest, same);
            }

            return same;
        }

        var loaded = Parse(settings, certificateText, keyText, certificateKey, keyKey, problems);
        if (loaded is not null)
        {
            s_parsed[settings.Name] = (digest, loaded);
        }

        return loaded;
    }

    /// <summary>Drops what was kept for certificates not named here (those of the configuration just loaded).</summary>
    public static void Forget(IEnumerable<string> except)
    {
        var keep = except.ToHashSet(StringComparer.Ordinal);
        foreach (var name in s_parsed.Keys)
        {
            if (!keep.Contains(name))
            {
                s_parsed.TryRemove(name, out _);
            }
        }
    }

    private static byte[] Digest(string certificateText, string keyText)
    {
        using var digest = IncrementalHash.CreateHash(HashAlgorithmName.SHA256);
        var certificate = System.Text.Encoding.UTF8.GetBytes(certificateText);
        digest.AppendData(BitConverter.GetBytes(certificate.Length));
        digest.AppendData(certificate);
        var key = System.Text.Encoding.UTF8.GetBytes(keyText);
        digest.AppendData(key);
        CryptographicOperations.ZeroMemory(key);
        return digest.GetHashAndReset();
    }

    private static ServerCertificate? Parse(CertificateSettings settings, string certificateText, string keyText, string certificateKey, string keyKey, List<ConfigurationProblem> problems)
    {

        var certificates = new X509Certificate2Collection();
        try
        {
            certificates.ImportFromPem(certificateText);
        }
        catch (CryptographicException ex)
        {
            problems.Add(new(certificateKey, $"'{settings.CertificatePath}' is not a valid PEM certificate: {ex.Message}"));
            return null;
        }

        if (certificates.Count == 0)
        {
            problems.Add(new(certificateKey, $"'{settings.CertificatePath}' holds no PEM certificate (-----BEGIN CERTIFICATE-----)"));
            return null;
        }

        if (Incomplete(certificateText, certificates.Count, settings.CertificatePath) is { } incomplete)
        {
            problems.Add(new(certificateKey, incomplete));
            return null;
        }

        var leaf = certificates[0];
        var chain = new X509Certificate2Collection();
        for (var i = 1; i < certificates.Count; i++)
        {
            chain.Add(certificates[i]);
        }

        var withKey = AttachKey(leaf, keyText, settings, keyKey, problems);
        return withKey is null ? null : new ServerCertificate(settings.Name, withKey, chain, settings.Hosts);
    }

    private static X509Certificate2? AttachKey(X509Certificate2 leaf, string keyText, CertificateSettings settings, string keyKey, List<ConfigurationProblem> problems)
    {
        using var rsa = leaf.GetRSAPublicKey();
        using var ecdsa = leaf.GetECDsaPublicKey();
        AsymmetricAlgorithm? key = rsa is not null ? RSA.Create() : ecdsa is not null ? ECDsa.Create() : null;
        if (key is null)
        {
            problems.Add(new(keyKey, $"the certificate in '{settings.CertificatePath}' has a key type Tern does not support (use RSA or ECDSA)"));
            return null;
        }

        using (key)
        {
            try
            {
                key.ImportFromPem(keyText);
            }
            catch (Exception ex) when (ex is ArgumentException or CryptographicException)
            {
                problems.Add(new(keyKey, $"'{settings.KeyPath}' holds no unencrypted PEM private key of the certificate's type ({(rsa is not null ? "RSA" : "ECDSA")}): {ex.Message}"));
                return null;
            }

            try
            {
                var combined = key is RSA r ? leaf.CopyWithPrivateKey(r) : leaf.CopyWithPrivateKey((ECDsa)key);
                return combined;
            }
            catch (Exception ex) when (ex is ArgumentException or CryptographicException)
            {
                problems.Add(new(keyKey, $"the key in '{settings.KeyPath}' does not match the certificate in '{settings.CertificatePath}'"));
                return null;
            }
        }
    }

    private static string? ReadText(string path, string key, List<ConfigurationProblem> problems)
    {
        try
        {
            return TernFile.ReadAllText(path);
        }
        catch (Exception ex) when (ex is IOException or UnauthorizedAccessException or NotSupportedException)
        {
            problems.Add(new(key, $"cannot read '{path}': {ex.Message}"));
            return null;
        }
    }
}
