using System.Runtime.CompilerServices;
using System.Runtime.InteropServices;
using System.Security.Cryptography;
using System.Security.Cryptography.X509Certificates;
using System.Text;

namespace Tern.Proxy.Tls.OpenSsl;

/// <summary>
/// The native contexts (one SSL_CTX per certificate) for one <see cref="CertificateSet"/> and one
/// listener's ALPN list, created once and reused by every connection until a reload replaces the set.
/// SNI is answered by <see cref="CertificateSet.Select"/>, the same choice the SslStream engine makes.
/// </summary>
internal sealed unsafe class OpenSslServer
{
    private readonly CertificateSet _certificates;
    private readonly Dictionary<ServerCertificate, int> _indexes = [];
    private GCHandle _self;

    public OpenSslServer(CertificateSet certificates, ReadOnlySpan<byte> alpn, ReadOnlyMemory<byte> ticketKeys, ClientCertificateTrust clientCertificates)
    {
        _certificates = certificates;
        // The native side holds only a weak handle: a handshake in progress keeps this object alive
        // through its connection, and nothing else should.
        _self = GCHandle.Alloc(this, GCHandleType.Weak);
        fixed (byte* alpnPointer = alpn)
        {
            Check(Interop.ServerCreate(alpnPointer, alpn.Length, &SelectCertificate, GCHandle.ToIntPtr(_self), out var handle), "create the TLS server");
            Handle = handle;
        }

        // Index 0 is what a client without SNI (or with an unknown name) gets.
        var ordered = new List<ServerCertificate> { certificates.Default };
        ordered.AddRange(certificates.All.Where(c => c != certificates.Default));
        foreach (var certificate in ordered)
        {
            _indexes[certificate] = AddCertificate(certificate);
        }

        if (clientCertificates.Mode != ClientCertificateMode.None)
        {
            fixed (byte* authorities = clientCertificates.Pem.Span)
            {
                Check(Interop.ServerSetClientCertificates(Handle, (int)clientCertificates.Mode, authorities, clientCertificates.Pem.Length), "load the client CA certificates",
                    "Tern:Https:ClientCertificates:TrustedCaPath");
            }
        }

        if (!ticketKeys.IsEmpty)
        {
            fixed (byte* keys = ticketKeys.Span)
            {
                Check(Interop.ServerSetTicketKeys(Handle, keys, ticketKeys.Length), "load the session ticket keys", "Tern:Tls:SessionTicketKeys");
            }
        }
    }

    public Interop.ServerHandle Handle { get; }

    // No Dispose: servers are replaced by reloads and released when nothing refers to them, the
    // native reference by Handle's own finalizer, the callback's handle here. Freeing the callback's
    // handle earlier would be unsafe while a connection still handshakes on these contexts.
    ~OpenSslServer() => FreeSelf();


    // Safe once this object is unreachable: the native side calls back only during a handshake,
    // and a handshake in progress holds this object through its connection.
    private void FreeSelf()
    {
        if (_self.IsAllocated)
        {
            _self.Free();
        }
    }

    [UnmanagedCallersOnly]
    private static int SelectCertificate(nint state, byte* name, int length)
    {
        try
        {
            if (GCHandle.FromIntPtr(state).Target is not OpenSslServer server)
            {
                return -1;
            }

            var serverName = name is null ? null : Encoding.ASCII.GetString(name, length);
            return server._indexes.TryGetValue(server._certificates.Select(serverName), out var index) ? index : -1;
        }
        catch (Exception)
        {
            // Never let an exception cross into native code: fall back to the default certificate.
            return -1;
        }
    }

    private int AddCertificate(ServerCertificate certificate)
    {
        var certificatePem = CertificateLoader.ToPem([certificate.Certificate, .. certificate.Chain]);
        var keyDer = ExportKey(certificate.Certificate);
        var keyPem = Encoding.ASCII.GetBytes(PemEncoding.Write("PRIVATE KEY", keyDer));
        try
        {
            fixed (byte* certificatePointer = certificatePem)
            fixed (byte* keyPointer = keyPem)
            {
                var index = Interop.ServerAddCertificate(Handle, certificatePointer, certificatePem.Length, keyPointer, keyPem.Length);
                Check(index, $"load certificate '{certificate.Name}'", $"Tern:Tls:Certificates:{certificate.Name}:CertificatePath");
                return index;
            }
        }
        finally
        {
            CryptographicOperations.ZeroMemory(keyDer);
            CryptographicOperations.ZeroMemory(keyPem);
        }
    }

    private static byte[] ExportKey(X509Certificate2 certificate)
    {
        using AsymmetricAlgorithm key = (AsymmetricAlgorithm?)certificate.GetECDsaPrivateKey() ?? certificate.GetRSAPrivateKey()
            ?? throw new InvalidOperationException($"certificate {certificate.Subject} has no RSA or ECDSA private key");
        return key.ExportPkcs8PrivateKey();
    }

    private static void Check(int result, string what, string? setting = null)
    {
        if (result < 0)
        {
            throw new OpenSslException($"OpenSSL could not {what}: {Interop.LastError()}", setting);
        }
    }
}

/// <summary>A failure reported by OpenSSL, with its reason and the setting that led to it, if any.</summary>
public sealed class OpenSslException(string message, string? setting = null) : Exception(message)
{
    public string? Setting { get; } = setting;
}
