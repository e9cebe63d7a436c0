using System.Runtime.CompilerServices;
using Tern.Proxy.Configuration;

namespace Tern.Proxy.Tls.OpenSsl;

/// <summary>
/// The OpenSSL engine's shared state: one native server (contexts for every certificate) per
/// configuration in force, built when that configuration is loaded so that a certificate OpenSSL
/// rejects fails the load, not each connection.
/// </summary>
internal sealed class OpenSslEngine
{
    // The HTTPS listener offers HTTP/2 first, then HTTP/1.1 (ALPN wire format).
    private static readonly byte[] s_alpn = "\u0002h2\u0008http/1.1"u8.ToArray();
    private readonly ConditionalWeakTable<ConfigurationSnapshot, OpenSslServer> _servers = [];

    // Without Tern:Tls:SessionTicketKeys: one random key for the process, so that a reload (which
    // builds new contexts) does not invalidate every ticket issued before it.
    private readonly byte[] _processTicketKey = System.Security.Cryptography.RandomNumberGenerator.GetBytes(ConfigurationSnapshot.SessionTicketKeySize);

    /// <summary>Why the engine cannot run here (library or OpenSSL missing), or null when it can.</summary>
    public static string? Probe()
    {
        const string fix = "build with `dotnet build` (needs cmake, gcc and libssl-dev) so libtern_tls.so sits next to Tern.Proxy.dll, and install OpenSSL 3 (Debian: libssl3), or set Tern:Tls:Engine=SslStream";
        try
        {
            var abi = Interop.GetAbiVersion();
            if (abi != Interop.AbiVersion)
            {
                return $"libtern_tls.so has ABI {abi} but this build needs {Interop.AbiVersion}: rebuild src/Native with `dotnet build`";
            }

            var version = Interop.OpenSslVersionNumber();
            return version < 0x30000000L ? $"OpenSSL {Interop.OpenSslVersion()} is older than 3.0: {fix}" : null;
        }
        catch (DllNotFoundException ex)
        {
            return $"libtern_tls.so or OpenSSL 3 (libssl.so.3) cannot be loaded ({ex.Message.Split('\n')[0]}): {fix}";
        }
        catch (EntryPointNotFoundException ex)
        {
            return $"libtern_tls.so is from another build ({ex.Message}): rebuild src/Native with `dotnet build`";
        }
    }

    /// <summary>The native server for this configuration, built on first use.</summary>
    public OpenSslServer ServerFor(ConfigurationSnapshot snapshot) =>
        _servers.GetValue(snapshot, s => new OpenSslServer(s.Certificates, s_alpn, s.SessionTicketKeys.IsEmpty ? _processTicketKey : s.SessionTicketKeys, s.ClientCertificates));
}
