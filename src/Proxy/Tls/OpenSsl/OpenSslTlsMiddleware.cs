using System.Diagnostics;
using Microsoft.AspNetCore.Connections;
using Microsoft.AspNetCore.Connections.Features;
using Microsoft.AspNetCore.Http.Features;
using Microsoft.AspNetCore.Server.Kestrel.Core.Features;
using Microsoft.Extensions.Logging;
using Tern.Proxy.Configuration;

namespace Tern.Proxy.Tls.OpenSsl;

/// <summary>
/// Kestrel connection middleware of the OpenSSL engine: handshake with a timeout, then the
/// connection's transport is replaced by the TLS connection's plaintext pipes, with the TLS
/// features Kestrel needs to pick HTTP/2 by ALPN.
/// </summary>
internal sealed class OpenSslTlsMiddleware(ConnectionDelegate next, ActiveConfiguration active, OpenSslEngine engine, TlsMetrics metrics, ILogger logger)
{
    public async Task OnConnectionAsync(ConnectionContext context)
    {
        var snapshot = active.Current;
        await using var tls = new OpenSslConnection(engine.ServerFor(snapshot), context.Transport, metrics,
            error =>
            {
                // After the handshake: the reason OpenSSL gave, as for a failed handshake (Kestrel
                // has it only in its own Debug line for the abort).
                TernLog.ConnectionFailed(logger, context.ConnectionId, context.RemoteEndPoint?.ToString() ?? "-", error.Message);
                context.Abort(new ConnectionAbortedException(error.Message, error));
            });
        var started = Stopwatch.GetTimestamp();
        string? failure;
        // Only the timeout cancels the handshake's reads. A client that goes away ends the
        // transport's input, which the handshake sees after it has read what came before: a
        // client that sends its Finished and closes at once has completed its handshake. (With
        // Kestrel's ConnectionClosed linked in, the read was cancelled with the Finished unread,
        // and 0.4-2.5% of such handshakes were counted as failures.)
        using (var timeout = new CancellationTokenSource(snapshot.Settings.HandshakeTimeout))
        {
            failure = await tls.HandshakeAsync(timeout.Token);
        }

        var elapsed = Stopwatch.GetElapsedTime(started);
        if (failure == "timeout" && context.ConnectionClosed.IsCancellationRequested)
        {
            failure = "closed"; // the client went away; the timeout did not fire
        }

        if (failure is not null)
        {
            var remote = context.RemoteEndPoint?.ToString() ?? "-";
            if (failure == NotTls.PlainHttpFailure)
            {
                metrics.HandshakeFailed(elapsed, failure);
                await NotTls.AnswerPlainHttpAsync(context, logger, snapshot.Settings.HandshakeTimeout - elapsed);
                return;
            }

            if (tls.ClientCertificateRefused)
            {
                metrics.HandshakeFailed(elapsed, TlsMetrics.ClientCertificateRefused);
                TernLog.ClientCertificateRefused(logger, context.ConnectionId, remote, failure);
            }
            else
            {
                metrics.HandshakeFailed(elapsed, failure.Split(':')[0]);
                TernLog.HandshakeFailed(logger, context.ConnectionId, remote, failure);
            }

            // Close so that the alert OpenSSL wrote (protocol_version, ...) reaches the client: not
            // by an abort, and, unless the client stayed silent, not with its input unread.
            if (failure == "timeout")
            {
                await context.Transport.Output.CompleteAsync();
            }
            else
            {
                await NotTls.CloseAfterAsync(context.Transport, snapshot.Settings.HandshakeTimeout - elapsed);
            }

            return;
        }

        metrics.HandshakeSucceeded(elapsed, tls.ProtocolVersion, tls.CipherName, System.Text.Encoding.ASCII.GetString(tls.ApplicationProtocol.Span), tls.Resumed);
        context.Features.Set<ITlsConnectionFeature>(tls);
        context.Features.Set<ITlsHandshakeFeature>(tls);
        context.Features.Set<ITlsApplicationProtocolFeature>(tls);
        var transport = context.Transport;
        context.Transport = tls;
        tls.Stopping = context.Features.Get<IConnectionLifetimeNotificationFeature>()?.ConnectionClosedRequested ?? default;
        tls.Start();
        metrics.ConnectionOpened();
        try
        {
            await next(context);
        }
        finally
        {
            metrics.ConnectionClosed();
            context.Transport = transport;
        }
    }
}
