namespace Tern.Proxy.Tls;

/// <summary>Values of Tern:Tls:Engine.</summary>
public static class TlsEngines
{
    /// <summary>Kestrel's own TLS (System.Net.Security.SslStream): the fallback and the baseline.</summary>
    public const string SslStream = "SslStream";

    /// <summary>Tern's OpenSSL 3 transport (src/Native).</summary>
    public const string OpenSsl = "OpenSsl";
}
