using System.IO.Pipelines;
using System.Security.Authentication;
using System.Security.Cryptography.X509Certificates;
using Microsoft.AspNetCore.Connections.Features;
using System.Net.Security;
using Microsoft.AspNetCore.Http.Features;
using Microsoft.AspNetCore.Server.Kestrel.Core.Features;
using Tern.Proxy.Listeners;

namespace Tern.Proxy.Tls.OpenSsl;

/// <summary>
/// One TLS connection on the OpenSSL engine. After the handshake it stands in for the
/// connection's transport: Kestrel reads plaintext that the decrypt pump had OpenSSL write
/// straight into the application pipe's memory, and writes plaintext that the encrypt pump has
/// OpenSSL turn into records written straight into the socket pipe's memory.
/// </summary>
internal sealed partial class OpenSslConnection : IDuplexPipe, ITlsConnectionFeature, ITlsHandshakeFeature, ITlsApplicationProtocolFeature, IAsyncDisposable
{
    // The SSL object is not thread-safe; each native call is short and synchronous.
    private readonly Lock _native = new();
    private readonly Interop.ConnectionHandle _handle;

    // The handle's pointer for the per-record calls, valid until DisposeAsync releases the
    // reference taken in the constructor (after both pumps have stopped).
    private readonly nint _ssl;
    private readonly OpenSslServer _server;
    private readonly IDuplexPipe _transport;
    private readonly Pipe _input;
    private readonly Pipe _output;
    private readonly TlsMetrics _metrics;
    private readonly Action<Exception> _abort;
    private Task _decrypting = Task.CompletedTask;
    private Task _encrypting = Task.CompletedTask;
    private static readonly TimeSpan s_closeGrace = TimeSpan.FromSeconds(5);

    // Both plaintext pipes take the pool's 32 KB blocks: the decrypt pump has OpenSSL write whole
    // records into one, and Kestrel writes responses into them, each becoming TLS records of up to
    // 16 KB (4 KB blocks made four times the records, and OpenSSL's cost per record outweighs its
    // cost per byte: 1 MB responses 2.9 CPU s/GB instead of 4.4, loadtest 2026-11-22-0631). One set
    // of options serves every connection (PipeOptions is immutable).
    private static readonly PipeOptions s_inputOptions = new(BlockPool.Instance, PipeScheduler.Inline, PipeScheduler.Inline, 1024 * 1024, 512 * 1024, BlockPool.BlockSize, useSynchronizationContext: false);
    private static readonly PipeOptions s_outputOptions = new(BlockPool.Instance, PipeScheduler.Inline, PipeScheduler.Inline, 64 * 1024, 32 * 1024, BlockPool.BlockSize, useSynchronizationContext: false);

    private int _pending;
    private int _inlineReads;

    // HTTP/2: many responses share the connection, so the encrypt pump's hop has others to batch.
    private bool _multiplexed;

    // Set by the decrypt pump when the client's side of the TCP connection ended (FIN or reset).
    private bool _peerClosed;

    // Set by the decrypt pump when the client sent close_notify: it sends nothing more.
    private bool _peerSentCloseNotify;

    // Set by the encrypt pump once Tern's close_notify is on its way: the client, which may still
    // be sending, is owed a lingering close.
    private bool _closeNotifySent;

    // The operation whose TLS error failed the connection first, and OpenSSL's reason (under _native).
    private Operation? _firstFailure;
    private string? _failureReason;

    /// <param name="server">The contexts to handshake with.</param>
    /// <param name="transport">The socket's pipes.</param>
    /// <param name="metrics">The Tern.Tls meter.</param>
    /// <param name="abort">Closes the connection abortively (on TLS errors).</param>
    public OpenSslConnection(OpenSslServer server, IDuplexPipe transport, TlsMetrics metrics, Action<Exception> abort)
    {
        _server = server;
        _abort = abort;
        _transport = transport;
        _metrics = metrics;
        if (Interop.ConnectionCreate(server.Handle, out var handle) != Interop.Ok)
        {
            handle.Dispose();
            throw new OpenSslException($"OpenSSL could not create a connection: {Interop.LastError()}");
        }

        _handle = handle;
        var added = false;
        _handle.DangerousAddRef(ref added);
        _ssl = _handle.DangerousGetHandle();
        _input = new Pipe(s_inputOptions);
        _output = new Pipe(s_outputOptions);
    }

    /// <summary>Plaintext for Kestrel's HTTP parsers.</summary>
    public PipeReader Input => _input.Reader;

    /// <summary>Plaintext from Kestrel, to be encrypted.</summary>
    public PipeWriter Output => _output.Writer;

    public SslProtocols Protocol { get; private set; }

    public string CipherName { get; private set; } = string.Empty;

    public bool Resumed { get; private set; }

    /// <summary>The server name the client sent (SNI), or empty.</summary>
    public string HostName { get; private set; } = string.Empty;

    public ReadOnlyMemory<byte> ApplicationProtocol { get; private set; }

    public X509Certificate2? ClientCertificate { get; set; }

    public TlsCipherSuite? NegotiatedCipherSuite => null;

    [Obsolete("KeyExchangeAlgorithm, KeyExchangeStrength, CipherAlgorithm, CipherStrength, HashAlgorithm and HashStrength are obsolete. Use NegotiatedCipherSuite instead.")]
    public CipherAlgorithmType CipherAlgorithm => CipherAlgorithmType.None;

    [Obsolete("KeyExchangeAlgorithm, KeyExchangeStrength, CipherAlgorithm, CipherStrength, HashAlgorithm and HashStrength are obsolete. Use NegotiatedCipherSuite instead.")]
    public int CipherStrength => 0;

    [Obsolete("KeyExchangeAlgorithm, KeyExchangeStrength, CipherAlgorithm, CipherStrength, HashAlgorithm and HashStrength are obsolete. Use NegotiatedCipherSuite instead.")]
    public HashAlgorithmType HashAlgorithm => HashAlgorithmType.None;

    [Obsolete("KeyExchangeAlgorithm, KeyExchangeStrength, CipherAlgorithm, CipherStrength, HashAlgorithm and HashStrength are obsolete. Use NegotiatedCipherSuite instead.")]
    public int HashStrength => 0;

    [Obsolete("KeyExchangeAlgorithm, KeyExchangeStrength, CipherAlgorithm, CipherStrength, HashAlgorithm and HashStrength are obsolete. Use NegotiatedCipherSuite instead.")]
    public ExchangeAlgorithmType KeyExchangeAlgorithm => ExchangeAlgorithmType.None;

    [Obsolete("KeyExchangeAlgorithm, KeyExchangeStrength, CipherAlgorithm, CipherStrength, HashAlgorithm and HashStrength are obsolete. Use NegotiatedCipherSuite instead.")]
    public int KeyExchangeStrength => 0;

    public Task<X509Certificate2?> GetClientCertificateAsync(CancellationToken cancellationToken) => Task.FromResult(ClientCertificate);

    /// <summary>Cuts a lingering close short: the server is stopping.</summary>
    public CancellationToken Stopping { get; set; }

    /// <summary>Starts the two pumps once the handshake is done.</summary>
    public void Start()
    {
        _decrypting = DecryptLoopAsync();
        _encrypting = EncryptLoopAsync();
    }

    public async ValueTask DisposeAsync()
    {
        // Kestrel is done with the connection: unblock both pumps and wait for them, so that no
        // native call is in flight when the SSL object is freed.
        _input.Reader.Complete();
        _output.Writer.Complete();
        _transport.Input.CancelPendingRead();
        await _decrypting.ConfigureAwait(false);
        try
        {
            // Time to send close_notify; a peer that no longer reads must not hold the connection.
            await _encrypting.WaitAsync(s_closeGrace).ConfigureAwait(false);
        }
        catch (TimeoutException)
        {
            _transport.Output.CancelPendingFlush();
            await _encrypting.ConfigureAwait(false);
        }

        if (_closeNotifySent)
        {
            // Tern ended the connection while the client's side was open: it may still be sending
            // (the rest of an upload Kestrel refused), and closing over its unread bytes would
            // reset the connection before it reads the answer.
            if (!Volatile.Read(ref _peerClosed) && !_peerSentCloseNotify)
            {
                await LingeringClose.DrainAsync(_transport.Input, LingeringClose.Quiet, LingeringClose.Quiet, LingeringClose.Limit, Stopping).ConfigureAwait(false);
            }

            await _transport.Output.CompleteAsync().ConfigureAwait(false);
        }

        _handle.DangerousRelease();
        _handle.Dispose();
        GC.KeepAlive(_server);
    }

    private void ReadNegotiatedParameters()
    {
        // Reports what OpenSSL negotiated; nothing here chooses a protocol.
#pragma warning disable CA5397
        Protocol = Interop.ConnectionProtocol(_handle) switch
        {
            0x0304 => SslProtocols.Tls13,
            0x0303 => SslProtocols.Tls12,
            _ => SslProtocols.None,
        };
#pragma warning restore CA5397
        CipherName = Interop.Cipher(_handle);
        ApplicationProtocol = Interop.Alpn(_handle);
        _multiplexed = ApplicationProtocol.Span.SequenceEqual("h2"u8);
        HostName = Interop.ServerName(_handle);
        Resumed = Interop.ConnectionResumed(_handle) == 1;
        var peer = Interop.PeerCertificate(_handle);
        ClientCertificate = peer is null ? null : X509CertificateLoader.LoadCertificate(peer);
    }

    /// <summary>"1.2" or "1.3", as OpenTelemetry's tls.protocol.version expects.</summary>
#pragma warning disable CA5397
    public string ProtocolVersion => Protocol switch
    {
        SslProtocols.Tls13 => "1.3",
        SslProtocols.Tls12 => "1.2",
        _ => "unknown",
    };
#pragma warning restore CA5397
}
