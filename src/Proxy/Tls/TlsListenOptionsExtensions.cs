using System.Net.Security;
using System.Runtime.CompilerServices;
using System.Security.Authentication;
using Microsoft.AspNetCore.Connections;
using Microsoft.AspNetCore.Server.Kestrel.Core;
using Microsoft.AspNetCore.Server.Kestrel.Https;
using Microsoft.Extensions.Logging;
using Tern.Proxy.Configuration;
using Tern.Proxy.Listeners;
using Tern.Proxy.Tls.OpenSsl;

namespace Tern.Proxy.Tls;

/// <summary>Entry point of the TLS feature on a Kestrel listener.</summary>
public static class TlsListenOptionsExtensions
{
    private static readonly List<SslApplicationProtocol> s_h2AndHttp11 = [SslApplicationProtocol.Http2, SslApplicationProtocol.Http11];
    private static readonly List<SslApplicationProtocol> s_http11 = [SslApplicationProtocol.Http11];

    /// <summary>
    /// Terminates TLS on this listener with the engine and certificates in force (Tern:Tls), the
    /// certificate chosen per connection by SNI, so that a certificate reload applies to the next
    /// handshake without touching open connections.
    /// </summary>
    public static ListenOptions UseTernTls(this ListenOptions listenOptions)
    {
        ArgumentNullException.ThrowIfNull(listenOptions);
        var services = listenOptions.ApplicationServices;
        var active = services.GetRequiredService<ActiveConfiguration>();
        if (active.Bound.TlsEngine == TlsEngines.OpenSsl)
        {
            var engine = services.GetRequiredService<OpenSslEngine>();
            var metrics = services.GetRequiredService<TlsMetrics>();
            var logger = services.GetRequiredService<ILoggerFactory>().CreateLogger("Tern.Proxy.Tls");
            listenOptions.Use(next => new OpenSslTlsMiddleware(next, active, engine, metrics, logger).OnConnectionAsync);
            return listenOptions;
        }

        return listenOptions.UseSslStream(active, services.GetRequiredService<ILoggerFactory>().CreateLogger("Tern.Proxy.Tls"));
    }

    private static ListenOptions UseSslStream(this ListenOptions listenOptions, ActiveConfiguration configuration, ILogger logger)
    {
        var protocols = listenOptions.Protocols.HasFlag(HttpProtocols.Http2) ? s_h2AndHttp11 : s_http11;

        // One options object per certificate and listener, built on first use and reused by every
        // handshake: SslStream copies what it needs, and rebuilding per connection costs allocations.
        // With client certificates on, options are per connection, so that a refusal is logged with
        // the connection it refused.
        var cache = new ConditionalWeakTable<ServerCertificate, SslServerAuthenticationOptions>();
        var handshakeTimeout = configuration.Bound.HandshakeTimeout; // a start-only setting on this engine
        listenOptions.Use(next => context => SslStreamFirstBytesAsync(context, next, handshakeTimeout, logger));
        listenOptions.UseHttps(new TlsHandshakeCallbackOptions
        {
            // Kestrel's own timer, started after the first bytes came; the deadline from the
            // accept (SslStreamFirstBytesAsync) ends the handshake first.
            HandshakeTimeout = handshakeTimeout,
            OnConnection = context =>
            {
                var snapshot = configuration.Current;
                var certificate = snapshot.Certificates.Select(context.ClientHelloInfo.ServerName);
                return ValueTask.FromResult(snapshot.ClientCertificates.Mode == ClientCertificateMode.None
                    ? cache.GetValue(certificate, c => Options(c, protocols, ClientCertificateTrust.None, context.Connection, logger))
                    : Options(certificate, protocols, snapshot.ClientCertificates, context.Connection, logger));
            },
        });
        listenOptions.Use(next => context =>
        {
            context.Features.Get<HandshakeDeadline>()?.Met();
            return next(context);
        });
        return listenOptions;
    }

    /// <summary>Aborts a connection whose SslStream handshake has not completed by the deadline counted from its accept.</summary>
    private sealed class HandshakeDeadline(CancellationTokenSource timeout, CancellationTokenRegistration abort)
    {
        /// <summary>Whether the handshake completed (Kestrel's HTTP layer has the connection).</summary>
        public bool IsMet { get; private set; }

        public void Met()
        {
            IsMet = true;
            abort.Dispose();
            timeout.Dispose();
        }
    }

    /// <summary>
    /// Looks at the client's first bytes before SslStream does, as the OpenSSL engine does: plain
    /// HTTP gets a 400; bytes that are not a TLS handshake record are closed here. SslStream takes a
    /// first record it cannot read as a ClientHello for a missing certificate and throws
    /// NotSupportedException ("must use a certificate with the associated private key"), and
    /// some malformed hellos make it throw ArgumentOutOfRangeException; Kestrel logged either as
    /// an error with a stack trace: any client could write one per connection. Each of these is a
    /// failed handshake at Debug under Tern.Proxy.Tls.
    /// </summary>
    private static async Task SslStreamFirstBytesAsync(ConnectionContext context, ConnectionDelegate next, TimeSpan handshakeTimeout, ILogger logger)
    {
        var input = context.Transport.Input;
        var started = System.Diagnostics.Stopwatch.GetTimestamp();
        using var timeout = new CancellationTokenSource(handshakeTimeout);
        NotTls.FirstBytes firstBytes;
        bool startsTls;
        bool closed;
        try
        {
            while (true)
            {
                var read = await input.ReadAsync(timeout.Token);
                firstBytes = NotTls.Classify(read.Buffer);
                startsTls = read.Buffer.FirstSpan is [NotTls.HandshakeRecord, ..];
                closed = read.Buffer.IsEmpty;
                if (firstBytes != NotTls.FirstBytes.Unknown || read.IsCompleted || read.IsCanceled)
                {
                    input.AdvanceTo(read.Buffer.Start); // not examined: SslStream reads these bytes again at once
                    break;
                }

                input.AdvanceTo(read.Buffer.Start, read.Buffer.End); // a method name may come in pieces
            }
        }
        catch (Exception ex) when (ex is OperationCanceledException or IOException or ConnectionResetException)
        {
            Failed(ex is OperationCanceledException ? "timeout" : "closed");
            return;
        }

        if (closed)
        {
            Failed("closed"); // connected and closed without a byte (a TCP health check)
            return;
        }

        if (firstBytes == NotTls.FirstBytes.PlainHttp)
        {
            await NotTls.AnswerPlainHttpAsync(context, logger, handshakeTimeout - System.Diagnostics.Stopwatch.GetElapsedTime(started));
            return;
        }

        if (!startsTls)
        {
            Failed("the first bytes are not a TLS handshake record");
            await NotTls.CloseAfterAsync(context.Transport, handshakeTimeout - System.Diagnostics.Stopwatch.GetElapsedTime(started));
            return;
        }

        // The handshake timeout counts from the accept, as on the OpenSSL engine: a client that
        // waited before its first byte does not get Kestrel's whole HandshakeTimeout again.
        var abort = timeout.Token.UnsafeRegister(static state =>
        {
            var (context, logger) = ((ConnectionContext, ILogger))state!;
            TernLog.HandshakeFailed(logger, context.ConnectionId, context.RemoteEndPoint?.ToString() ?? "-", "timeout");
            context.Abort(new ConnectionAbortedException("The TLS handshake did not complete within Tern:Tls:HandshakeTimeout."));
        }, (context, logger));
        var handshake = new HandshakeDeadline(timeout, abort);
        context.Features.Set(handshake);
        context.Features.Set(new LingeringClose.LastRequest());
        try
        {
            await next(context);

            // SslStream is done (it leaves the socket's pipes open): drain a client still
            // sending before Kestrel closes the socket.
            if (handshake.IsMet)
            {
                await LingeringClose.AfterAsync(context);
            }
        }
        catch (Exception ex) when (!handshake.IsMet)
        {
            // Kestrel handles the handshake failures it expects (IOException, AuthenticationException,
            // cancellation); what escapes it is SslStream failing on a hello it could not read:
            // NotSupportedException for an empty or non-hello first record, ArgumentOutOfRangeException
            // for some malformed ones (1 of 1,500 fuzzed hellos).
            Failed($"SslStream could not read the ClientHello ({ex.GetType().Name}: {ex.Message})");
        }
        catch (IOException ex)
        {
            // After the handshake: SslStream failed (a corrupted record from the client, seen over
            // HTTP/2 as the failed write of Kestrel's GOAWAY when it disposes the stream). Kestrel
            // logged it as "Unhandled exception while processing", an error with a stack trace that
            // any client could write; it is the connection's TLS error, at Debug, as on the OpenSSL
            // engine.
            TernLog.ConnectionFailed(logger, context.ConnectionId, context.RemoteEndPoint?.ToString() ?? "-", ex.InnerException?.Message is { } inner ? $"{ex.Message} ({inner})" : ex.Message);
        }

        void Failed(string reason) => TernLog.HandshakeFailed(logger, context.ConnectionId, context.RemoteEndPoint?.ToString() ?? "-", reason);
    }

    private static SslServerAuthenticationOptions Options(ServerCertificate certificate, List<SslApplicationProtocol> protocols, ClientCertificateTrust trust,
        ConnectionContext connection, ILogger logger)
    {
        var options = new SslServerAuthenticationOptions
        {
            ServerCertificateContext = certificate.StreamContext,
            ApplicationProtocols = protocols,
            EnabledSslProtocols = SslProtocols.Tls12 | SslProtocols.Tls13,
            CertificateRevocationCheckMode = System.Security.Cryptography.X509Certificates.X509RevocationMode.NoCheck,
            AllowRenegotiation = false,
            ClientCertificateRequired = trust.Mode != ClientCertificateMode.None,
        };

        if (trust.Mode != ClientCertificateMode.None)
        {
            options.CertificateChainPolicy = trust.ChainPolicy();
            options.RemoteCertificateValidationCallback = (_, presented, chain, errors) =>
            {
                if (trust.Accepts(presented, chain, errors, out var reason))
                {
                    return true;
                }

                TernLog.ClientCertificateRefused(logger, connection.ConnectionId, connection.RemoteEndPoint?.ToString() ?? "-", reason!);
                return false;
            };
        }

        return options;
    }
}
