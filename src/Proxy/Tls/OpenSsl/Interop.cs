using System.Runtime.InteropServices;
using Microsoft.Win32.SafeHandles;

namespace Tern.Proxy.Tls.OpenSsl;

/// <summary>The exports of libtern_tls (src/Native/tern_tls.h); nothing native leaves this class.</summary>
internal static unsafe partial class Interop
{
    private const string Library = "tern_tls";

    /// <summary>The ABI this build expects (TERN_TLS_ABI_VERSION).</summary>
    public const int AbiVersion = 5;

    public const int Ok = 0;
    public const int WantRead = 1;
    public const int Closed = 2;
    public const int OutputFull = 3;
    public const int Error = -1;

    [StructLayout(LayoutKind.Sequential)]
    public struct Result
    {
        public int Status;
        public int Consumed;
        public int Produced;
        public int Spilled;
        public int Pending;
        public int Drained;
    }

    [LibraryImport(Library, EntryPoint = "TernTls_AbiVersion")]
    public static partial int GetAbiVersion();

    [LibraryImport(Library, EntryPoint = "TernTls_OpenSslVersionNumber")]
    public static partial long OpenSslVersionNumber();

    [LibraryImport(Library, EntryPoint = "TernTls_OpenSslVersionText")]
    private static partial int OpenSslVersionText(byte* buffer, int capacity);

    [LibraryImport(Library, EntryPoint = "TernTls_LastErrorText")]
    private static partial int LastErrorText(byte* buffer, int capacity);

    [LibraryImport(Library, EntryPoint = "TernTls_ServerCreate")]
    public static partial int ServerCreate(byte* alpn, int alpnLength, delegate* unmanaged<nint, byte*, int, int> selector, nint state, out ServerHandle server);

    [LibraryImport(Library, EntryPoint = "TernTls_ServerAddCertificate")]
    public static partial int ServerAddCertificate(ServerHandle server, byte* certificatePem, int certificateLength, byte* keyPem, int keyLength);

    [LibraryImport(Library, EntryPoint = "TernTls_ServerSetTicketKeys")]
    public static partial int ServerSetTicketKeys(ServerHandle server, byte* keys, int length);

    [LibraryImport(Library, EntryPoint = "TernTls_ServerSetClientCertificates")]
    public static partial int ServerSetClientCertificates(ServerHandle server, int mode, byte* caPem, int caLength);

    [LibraryImport(Library, EntryPoint = "TernTls_ServerRelease")]
    public static partial void ServerRelease(nint server);

    [LibraryImport(Library, EntryPoint = "TernTls_ConnectionCreate")]
    public static partial int ConnectionCreate(ServerHandle server, out ConnectionHandle connection);

    [LibraryImport(Library, EntryPoint = "TernTls_ConnectionFree")]
    public static partial void ConnectionFree(nint connection);

    // The four operations take the raw pointer: they run for every record, and the connection
    // holds one reference on its handle for its whole life (see OpenSslConnection), instead of
    // the marshaller taking and dropping one per call.
    [LibraryImport(Library, EntryPoint = "TernTls_Handshake")]
    public static partial int Handshake(nint connection, byte* input, int inputLength, byte* output, int outputLength, out Result result);

    [LibraryImport(Library, EntryPoint = "TernTls_Decrypt")]
    public static partial int Decrypt(nint connection, byte* input, int inputLength, byte* output, int outputLength, out Result result);

    [LibraryImport(Library, EntryPoint = "TernTls_Encrypt")]
    public static partial int Encrypt(nint connection, byte* input, int inputLength, byte* output, int outputLength, out Result result);

    [LibraryImport(Library, EntryPoint = "TernTls_Shutdown")]
    public static partial int Shutdown(nint connection, byte* output, int outputLength, out Result result);

    [LibraryImport(Library, EntryPoint = "TernTls_ConnectionProtocol")]
    public static partial int ConnectionProtocol(ConnectionHandle connection);

    [LibraryImport(Library, EntryPoint = "TernTls_ConnectionResumed")]
    public static partial int ConnectionResumed(ConnectionHandle connection);

    [LibraryImport(Library, EntryPoint = "TernTls_ConnectionCipher")]
    private static partial int ConnectionCipher(ConnectionHandle connection, byte* buffer, int capacity);

    [LibraryImport(Library, EntryPoint = "TernTls_ConnectionAlpn")]
    private static partial int ConnectionAlpn(ConnectionHandle connection, byte* buffer, int capacity);

    [LibraryImport(Library, EntryPoint = "TernTls_ConnectionServerName")]
    private static partial int ConnectionServerName(ConnectionHandle connection, byte* buffer, int capacity);

    [LibraryImport(Library, EntryPoint = "TernTls_ConnectionPeerCertificate")]
    private static partial int ConnectionPeerCertificate(ConnectionHandle connection, byte* buffer, int capacity);

    [LibraryImport(Library, EntryPoint = "TernTls_ConnectionPartialRecord")]
    public static partial int ConnectionPartialRecord(ConnectionHandle connection);

    [LibraryImport(Library, EntryPoint = "TernTls_ConnectionClientCertificateRefused")]
    public static partial int ConnectionClientCertificateRefused(ConnectionHandle connection);

    [LibraryImport(Library, EntryPoint = "TernTls_ConnectionError")]
    private static partial int ConnectionError(ConnectionHandle connection, byte* buffer, int capacity);

    public static string OpenSslVersion() => Text((b, c) => OpenSslVersionText(b, c));

    /// <summary>Text of the calling thread's OpenSSL error queue (for failed Server calls).</summary>
    public static string LastError() => Text((b, c) => LastErrorText(b, c));

    public static string Cipher(ConnectionHandle connection) => Text((b, c) => ConnectionCipher(connection, b, c));

    public static byte[] Alpn(ConnectionHandle connection)
    {
        var buffer = stackalloc byte[256];
        var length = ConnectionAlpn(connection, buffer, 256);
        return length <= 0 ? [] : new ReadOnlySpan<byte>(buffer, length).ToArray();
    }

    /// <summary>The client's verified certificate (DER), or null when it sent none.</summary>
    public static byte[]? PeerCertificate(ConnectionHandle connection)
    {
        var needed = ConnectionPeerCertificate(connection, null, 0);
        if (needed == 0)
        {
            return null;
        }

        var der = new byte[-needed];
        fixed (byte* buffer = der)
        {
            return ConnectionPeerCertificate(connection, buffer, der.Length) == der.Length ? der : null;
        }
    }

    public static string ServerName(ConnectionHandle connection) => Text((b, c) => ConnectionServerName(connection, b, c));

    public static string ConnectionErrorText(ConnectionHandle connection) => Text((b, c) => ConnectionError(connection, b, c));

    private delegate int Reader(byte* buffer, int capacity);

    private static string Text(Reader read)
    {
        var buffer = stackalloc byte[512];
        var length = read(buffer, 512);
        return length <= 0 ? string.Empty : System.Text.Encoding.UTF8.GetString(buffer, Math.Min(length, 511));
    }

    /// <summary>A native certificate set (TernTlsServer); connections hold their own reference.</summary>
    internal sealed class ServerHandle() : SafeHandleZeroOrMinusOneIsInvalid(ownsHandle: true)
    {
        protected override bool ReleaseHandle()
        {
            ServerRelease(handle);
            return true;
        }
    }

    /// <summary>One native TLS connection (SSL + BIO + spill buffer).</summary>
    internal sealed class ConnectionHandle() : SafeHandleZeroOrMinusOneIsInvalid(ownsHandle: true)
    {
        protected override bool ReleaseHandle()
        {
            ConnectionFree(handle);
            return true;
        }
    }
}
