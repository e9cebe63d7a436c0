using System.Net.Security;
using System.Security.Cryptography.X509Certificates;

namespace Tern.Proxy.Tls;

/// <summary>A loaded certificate with its private key and chain, ready for handshakes.</summary>
public sealed class ServerCertificate(string name, X509Certificate2 certificate, X509Certificate2Collection chain, IReadOnlyList<string> hosts)
{
    /// <summary>The name under Tern:Tls:Certificates (or "self-signed").</summary>
    public string Name { get; } = name;

    /// <summary>The host names it is configured for (empty: the default certificate).</summary>
    public IReadOnlyList<string> Hosts { get; } = hosts;

    /// <summary>The leaf certificate, with its private key.</summary>
    public X509Certificate2 Certificate { get; } = certificate;

    /// <summary>Intermediate certificates sent after the leaf.</summary>
    public X509Certificate2Collection Chain { get; } = chain;

    /// <summary>SslStream's pre-built context (chain resolved once, not per handshake).</summary>
    public SslStreamCertificateContext StreamContext { get; } = SslStreamCertificateContext.Create(certificate, chain, offline: true);
}
