using System.Security.Cryptography;
using System.Security.Cryptography.X509Certificates;
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
        string text;
        try
        {
            text = TernFile.ReadAllText(path);
            authorities.ImportFromPem(text);
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

        if (CertificateLoader.Incomplete(text, authorities.Count, path) is { } incomplete)
        {
            problems.Add(new(key, incomplete));
            return None;
        }

        // Re-encoded from what was parsed, so that the OpenSSL engine trusts exactly these.
        return new ClientCertificateTrust(settings.ClientCertificateMode, authorities, CertificateLoader.ToPem(authorities));
    }

    /// <summary>
    /// The SslStream engine's chain rules, the OpenSSL engine's: only these CAs as roots, only the
    /// intermediates the client sent (never fetched from the URLs a certificate names, which would let
    /// any client make Tern send requests), client-authentication usage, no revocation check.
    /// </summary>
    public X509ChainPolicy ChainPolicy()
    {
        var policy = new X509ChainPolicy
        {
            TrustMode = X509ChainTrustMode.CustomRootTrust,
            RevocationMode = X509RevocationMode.NoCheck,
            DisableCertificateDownloads = true,
        };
        policy.CustomTrustStore.AddRange(Authorities);
        policy.ApplicationPolicy.Add(new Oid(ClientAuthentication));
        return policy;
    }

    /// <summary>
    /// The SslStream engine's verdict on a client, its chain built under <see cref="ChainPolicy"/>;
    /// reason says why it is refused, or is null when it is accepted.
    /// </summary>
    public bool Accepts(X509Certificate? certificate, X509Chain? chain, System.Net.Security.SslPolicyErrors errors, out string? reason)
    {
        reason = null;
        if (certificate is null)
        {
            reason = Mode == ClientCertificateMode.Required ? "the client sent no certificate" : null;
            return reason is null;
        }

        if (errors == System.Net.Security.SslPolicyErrors.None)
        {
            return true;
        }

        var status = chain is null ? string.Empty
            : string.Join("; ", chain.ChainStatus.Select(s => s.StatusInformation.Trim()).Where(s => s.Length > 0).Distinct());
        reason = $"untrusted client certificate '{certificate.Subject}': {(status.Length > 0 ? status : errors.ToString())}";
        return false;
    }
}
