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

    private readonly Lock _lock = new();

    // The last server built, and what it was built from (see Identity).
    private (byte[] Identity, OpenSslServer Server)? _last;

    /// <summary>
    /// The native server for this configuration, built on first use, or the last one built when
    /// this configuration's TLS is the same. Building one creates a context per certificate, about
    /// 1 ms each with OpenSSL 3.0: with 200 certificates that was about half of every reload's CPU,
    /// a change to a route as much as one to a certificate (loadtest/README.md, 2026-11-25 17:45).
    /// </summary>
    public OpenSslServer ServerFor(ConfigurationSnapshot snapshot) =>
        _servers.GetValue(snapshot, s =>
        {
            var ticketKeys = s.SessionTicketKeys.IsEmpty ? _processTicketKey : s.SessionTicketKeys;
            var identity = Identity(s.Certificates, ticketKeys, s.ClientCertificates);
            lock (_lock)
            {
                if (_last is { } last && last.Identity.AsSpan().SequenceEqual(identity))
                {
                    return last.Server;
                }
            }

            var server = new OpenSslServer(s.Certificates, s_alpn, ticketKeys, s.ClientCertificates);
            lock (_lock)
            {
                _last = (identity, server);
            }

            return server;
        });

    /// <summary>
    /// A digest of everything a server's contexts are built from: each certificate's name, hosts,
    /// leaf and chain (a leaf fixes its key), which one is the default, the ticket keys and the
    /// client-certificate settings.
    /// </summary>
    internal static byte[] Identity(CertificateSet certificates, ReadOnlyMemory<byte> ticketKeys, ClientCertificateTrust clientCertificates)
    {
        using var digest = System.Security.Cryptography.IncrementalHash.CreateHash(System.Security.Cryptography.HashAlgorithmName.SHA256);
        void Add(ReadOnlySpan<byte> bytes)
        {
            Span<byte> length = stackalloc byte[4];
            System.Buffers.Binary.BinaryPrimitives.WriteInt32LittleEndian(length, bytes.Length);
            digest.AppendData(length);
            digest.AppendData(bytes);
        }

        void AddText(string text) => Add(System.Text.Encoding.UTF8.GetBytes(text));

        AddText(certificates.Default.Name);
        foreach (var certificate in certificates.All)
        {
            AddText(certificate.Name);
            AddText(string.Join('\n', certificate.Hosts));
            Add(certificate.Certificate.RawDataMemory.Span);
            AddText(certificate.Chain.Count.ToString(System.Globalization.CultureInfo.InvariantCulture));
            foreach (var intermediate in certificate.Chain)
            {
                Add(intermediate.RawDataMemory.Span);
            }
        }

        Add(ticketKeys.Span);
        AddText(clientCertificates.Mode.ToString());
        Add(clientCertificates.Pem.Span);
        return digest.GetHashAndReset();
    }
}
