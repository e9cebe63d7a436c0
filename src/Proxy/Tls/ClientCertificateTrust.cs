using System.Security.Cryptography;
using System.Security.Cryptography.X509Certificates;
using System.Text;
using Tern.Proxy.Configuration;

namespace Tern.Proxy.Tls;

/// <summary>Values of Tern:Https:ClientCertificates:Mode (mutual TLS on the HTTPS listener).</summary>
public enum ClientCertificateMode
{
    /// <summary>Clients are not asked for a certificate.</summary>
    None,

    /// <summary>Clients are asked; one without a certificate carries on, an untrusted one is refused.</summary>
    Optional,

    /// <summary>A client without a trusted certificate is refused in the handshake.</summary>
    Required,
}

/// <summary>
/// Which client certificates the HTTPS listener accepts: issued (directly or through intermediates
/// the client sends) by one of the CAs in Tern:Https:ClientCertificates:TrustedCaPath, in their
/// validity period and usable for client authentication. Both engines apply the same rules.
/// </summary>
public sealed class ClientCertificateTrust
{
    private const string ClientAuthentication = "1.3.6.1.5.5.7.3.2";

    public static ClientCertificateTrust None { get; } = new(ClientCertificateMode.None, [], []);

    private ClientCertificateTrust(ClientCertificateMode mode, X509Certificate2Collection authorities, byte[] pem)
    {
        Mode = mode;
        Authorities = authorities;
        Pem = pem;
    }

    public ClientCertificateMode Mode { get; }

    /// <summary>The trusted CA certificates.</summary>
    public X509Certificate2Collection Authorities { get; }

    /// <summary>The same CAs as PEM text (ASCII), for the OpenSSL engine.</summary>
    public ReadOnlyMemory<byte> Pem { get; }

    internal static ClientCertificateTrust Load(TernSettings settings, List<ConfigurationProblem> problems)
    {
        const string key = "Tern:Https:ClientCertificates:TrustedCaPath";
        if (settings.ClientCertificateMode == ClientCertificateMode.None)
        {
            return None;
        }

        var path = settings.TrustedClientCaPath;
        if (path is null)
        {
            problems.Add(new(key, $"is required when Tern:Https:ClientCertificates:Mode is {settings.ClientCertificateMode}: the path of a PEM file of the CA certificates that issue client certificates"));
            return None;
        }

        var authorities = new X509Certificate2Collection();
        try
        {
            authorities.ImportFromPem(File.ReadAllText(path));
        }
        catch (Exception ex) when (ex is IOException or UnauthorizedAccessException)
        {
            problems.Add(new(key, $"cannot read '{path}': {ex.Message}"));
            return None;
        }
        catch (CryptographicException ex)
        {
            problems.Add(new(key, $"'{path}' is not a valid PEM certificate bundle: {ex.Message}"));
            return None;
        }

        if (authorities.Count == 0)
        {
            problems.Add(new(key, $"'{path}' holds no PEM certificate (-----BEGIN CERTIFICATE-----)"));
            return None;
        }

        // Re-encoded from what was parsed, so that the OpenSSL engine trusts exactly these.
        var pem = new StringBuilder();
        foreach (var authority in authorities)
        {
            pem.Append(authority.ExportCertificatePem()).Append('\n');
        }

        return new ClientCertificateTrust(settings.ClientCertificateMode, authorities, Encoding.ASCII.GetBytes(pem.ToString()));
    }

    /// <summary>
    /// Checks a client's certificate the way the OpenSSL engine does (SslStream engine); reason
    /// says why it is refused, or is null when it is accepted.
    /// </summary>
    public bool Accepts(X509Certificate? certificate, X509Chain? presented, out string? reason)
    {
        reason = null;
        if (certificate is null)
        {
            reason = Mode == ClientCertificateMode.Required ? "the client sent no certificate" : null;
            return reason is null;
        }

        using var chain = new X509Chain();
        chain.ChainPolicy.TrustMode = X509ChainTrustMode.CustomRootTrust;
        chain.ChainPolicy.CustomTrustStore.AddRange(Authorities);
        chain.ChainPolicy.RevocationMode = X509RevocationMode.NoCheck;
        chain.ChainPolicy.ApplicationPolicy.Add(new Oid(ClientAuthentication));
        if (presented is not null)
        {
            // The intermediates the client sent with its certificate.
            foreach (var element in presented.ChainElements)
            {
                chain.ChainPolicy.ExtraStore.Add(element.Certificate);
            }
        }

        using var loaded = certificate is X509Certificate2 ? null : X509CertificateLoader.LoadCertificate(certificate.GetRawCertData());
        var leaf = certificate as X509Certificate2 ?? loaded!;
        if (chain.Build(leaf))
        {
            return true;
        }

        reason = string.Join("; ", chain.ChainStatus.Select(s => s.StatusInformation.Trim()).Where(s => s.Length > 0).Distinct());
        reason = $"untrusted client certificate '{leaf.Subject}': {(reason.Length > 0 ? reason : "chain not valid")}";
        return false;
    }
}
