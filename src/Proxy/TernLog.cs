using Microsoft.Extensions.Logging;

namespace Tern.Proxy;

/// <summary>
/// Every log message Tern writes, with stable event ids kept in one place:
/// 1xx configuration, 2xx TLS, 3xx forwarding, 4xx lifecycle.
/// </summary>
internal static partial class TernLog
{
    [LoggerMessage(100, LogLevel.Error, "Configuration reload: {Key}: {Problem}")]
    public static partial void ReloadProblem(ILogger logger, string key, string problem);

    [LoggerMessage(101, LogLevel.Error, "Configuration reload rejected ({Count} problem(s)); the last good configuration stays in force")]
    public static partial void ReloadRejected(ILogger logger, int count);

    [LoggerMessage(102, LogLevel.Information, "Configuration reloaded: routes, clusters and {Certificates} certificate(s) in force")]
    public static partial void Reloaded(ILogger logger, int certificates);

    [LoggerMessage(103, LogLevel.Warning, "{Key} changed to {Value}; it is applied at start, restart Tern to apply it")]
    public static partial void RestartNeeded(ILogger logger, string key, string value);

    [LoggerMessage(104, LogLevel.Warning, "{Key} {Reason}")]
    public static partial void UnknownSetting(ILogger logger, string key, string reason);

    [LoggerMessage(106, LogLevel.Error, "Configuration reload failed: {Reason}; the last good configuration stays in force")]
    public static partial void ReloadFailed(ILogger logger, Exception exception, string reason);

    [LoggerMessage(107, LogLevel.Warning, "{Key} {Reason}")]
    public static partial void KestrelSettingIgnored(ILogger logger, string key, string reason);

    [LoggerMessage(108, LogLevel.Warning, "{Key} {Reason}")]
    public static partial void YarpSettingIgnored(ILogger logger, string key, string reason);

    [LoggerMessage(109, LogLevel.Warning, "{Key} {Reason}")]
    public static partial void SectionGivenValue(ILogger logger, string key, string reason);

    /// <summary>A key Tern ignores (see ConfigurationSnapshot.Unread): one event for each kind.</summary>
    public static void Unread(ILogger logger, Configuration.UnreadSetting unread)
    {
        Action<ILogger, string, string> log = unread.Kind switch
        {
            Configuration.UnreadSetting.Kinds.GivenToSection => SectionGivenValue,
            Configuration.UnreadSetting.Kinds.NotKestrelLimit => KestrelSettingIgnored,
            Configuration.UnreadSetting.Kinds.NotYarp => YarpSettingIgnored,
            _ => UnknownSetting,
        };
        log(logger, unread.Key, unread.Reason);
    }

    [LoggerMessage(105, LogLevel.Error, "Configuration reload: {File}: .NET could not apply the change ({Reason}); what it concerns keeps its previous settings")]
    public static partial void ReloadNotApplied(ILogger logger, string file, string reason);

    [LoggerMessage(200, LogLevel.Warning, "No certificate is configured under Tern:Tls:Certificates; serving a self-signed certificate for localhost from {Path}. Configure a real certificate for production.")]
    public static partial void SelfSignedInUse(ILogger logger, string path);

    [LoggerMessage(201, LogLevel.Information, "TLS engine {Engine}: certificate '{Name}' ({Subject}, expires {NotAfter:u}) for {Hosts}")]
    public static partial void CertificateInUse(ILogger logger, string engine, string name, string subject, DateTime notAfter, string hosts);

    [LoggerMessage(202, LogLevel.Warning, "Certificate '{Name}' ({Subject}) expired on {NotAfter:u}")]
    public static partial void CertificateExpired(ILogger logger, string name, string subject, DateTime notAfter);

    [LoggerMessage(203, LogLevel.Debug, "TLS handshake failed on connection {ConnectionId} from {Remote}: {Reason}")]
    public static partial void HandshakeFailed(ILogger logger, string connectionId, string remote, string reason);

    [LoggerMessage(205, LogLevel.Debug, "Connection {ConnectionId} from {Remote} closed: {Reason}")]
    public static partial void ConnectionFailed(ILogger logger, string connectionId, string remote, string reason);

    [LoggerMessage(204, LogLevel.Debug, "TLS client certificate refused on connection {ConnectionId} from {Remote}: {Reason} (Tern:Https:ClientCertificates)")]
    public static partial void ClientCertificateRefused(ILogger logger, string connectionId, string remote, string reason);

    [LoggerMessage(300, LogLevel.Information, "{Method} {Path} returned 499: the client closed the connection before the response (route {Route})")]
    public static partial void ClientClosedRequest(ILogger logger, string method, string path, string route);

    [LoggerMessage(307, LogLevel.Information, "{Method} {Path}: the client went away during its {Status} response (it closed its connection, or reset its stream over HTTP/2) (route {Route})")]
    public static partial void ClientLeftMidResponse(ILogger logger, string method, string path, int status, string route);

    [LoggerMessage(303, LogLevel.Information, "{Method} {Path} returned {Status}: the request body was rejected: {Reason} (route {Route})")]
    public static partial void RequestBodyRejected(ILogger logger, string method, string path, int status, string reason, string route);

    [LoggerMessage(302, LogLevel.Warning, "{Method} {Path} was cut off: Tern:Shutdown:DrainTimeout ran out before it finished (route {Route})")]
    public static partial void CutByShutdown(ILogger logger, string method, string path, string route);

    [LoggerMessage(301, LogLevel.Warning, "{Method} {Path} returned {Status}: {Reason} (route {Route}, cluster {Cluster}, destination {Destination}): {Detail}")]
    public static partial void UpstreamFailed(ILogger logger, string method, string path, int status, string reason, string route, string cluster, string destination, string detail);

    [LoggerMessage(305, LogLevel.Information, "{Method} {Path}: the upgraded connection (a WebSocket, say) carried nothing for the cluster's HttpRequest:ActivityTimeout and was closed (route {Route}, cluster {Cluster}, destination {Destination})")]
    public static partial void UpgradeIdleClosed(ILogger logger, string method, string path, string route, string cluster, string destination);

    [LoggerMessage(306, LogLevel.Information, "{Method} {Path}: the client read nothing more of its {Status} response for the cluster's HttpRequest:ActivityTimeout, so Tern ended it (its connection over HTTP/1.1, its stream over HTTP/2) (route {Route}, cluster {Cluster}, destination {Destination})")]
    public static partial void ClientStoppedReading(ILogger logger, string method, string path, int status, string route, string cluster, string destination);

    [LoggerMessage(304, LogLevel.Warning, "{Method} {Path} was cut short after its {Status} response began: {Reason} (route {Route}, cluster {Cluster}, destination {Destination}): {Detail}")]
    public static partial void UpstreamCutResponse(ILogger logger, string method, string path, int status, string reason, string route, string cluster, string destination, string detail);

    [LoggerMessage(308, LogLevel.Warning, "{Method} {Path} returned 500: two or more of the routes that match it ({Routes}) match it alike (the same Order and rank), so the router chose none; give the one that should win a lower Order, or tell their Match apart")]
    public static partial void RoutesAmbiguous(ILogger logger, string method, string path, string routes);

    [LoggerMessage(309, LogLevel.Debug, "{Method} {Path}: request headers {Names} not forwarded: their names have underscores (Tern:Forwarding:UnderscoresInHeaders)")]
    public static partial void UnderscoreHeadersDropped(ILogger logger, string method, string path, string names);

    [LoggerMessage(500, LogLevel.Warning, "OTLP export (OTEL_EXPORTER_OTLP_ENDPOINT): {Message}")]
    public static partial void OtlpExportProblem(ILogger logger, string message);

    [LoggerMessage(501, LogLevel.Warning, "{Variable}={Value} not used: {Consequence}")]
    public static partial void OtlpSettingIgnored(ILogger logger, string variable, string value, string consequence);

    [LoggerMessage(502, LogLevel.Warning, "{Variable} not used: the OTLP exporter cannot read it (write name=value entries separated by commas, each name once and a valid HTTP header name, User-Agent not among them; the value is not shown, as it may hold a key), so nothing is pushed")]
    public static partial void OtlpHeadersIgnored(ILogger logger, string variable);

    [LoggerMessage(504, LogLevel.Warning, "{Variable} not used: Tern's exporter, OpenTelemetry .NET's AddOtlpExporter, reads {General} for metrics and traces alike{Consequence}")]
    public static partial void OtlpPerSignalIgnored(ILogger logger, string variable, string general, string consequence);

    [LoggerMessage(503, LogLevel.Warning, "OTLP export off: the exporter cannot be made with the OTEL_ settings ({Message}), so nothing is pushed")]
    public static partial void OtlpExporterNotMade(ILogger logger, string message);

    [LoggerMessage(400, LogLevel.Information, "Tern listening: HTTPS {HttpsPort}, HTTP {HttpPort} (redirects to HTTPS {RedirectPort}), management {ManagementPort}")]
    public static partial void Listening(ILogger logger, int httpsPort, int httpPort, int redirectPort, int managementPort);

    [LoggerMessage(401, LogLevel.Information, "Demo upstream (echo) on http://127.0.0.1:{Port}/; set Tern:Demo:Enabled=false when pointing clusters at real apps")]
    public static partial void DemoEnabled(ILogger logger, int port);

    [LoggerMessage(402, LogLevel.Information, "Shutting down: no new connections; draining in-flight requests for up to {DrainTimeout}")]
    public static partial void Draining(ILogger logger, TimeSpan drainTimeout);

    [LoggerMessage(403, LogLevel.Information, "Connections are served on the socket event threads, one per core ({Variable}=1; 0 hands them to the thread pool)")]
    public static partial void EventThreads(ILogger logger, string variable);

    [LoggerMessage(404, LogLevel.Information, "Connections are handed to the thread pool ({Variable}={Value}); unset it for Tern's default, the socket event threads, which take less CPU per request")]
    public static partial void ThreadPoolIo(ILogger logger, string variable, string value);

    [LoggerMessage(405, LogLevel.Information, "Idle thread-pool workers spin at most {Limit} times before they sleep ({Source})")]
    public static partial void ThreadPoolSpinLimit(ILogger logger, int limit, string source);

    [LoggerMessage(406, LogLevel.Warning, "{Key}: port {Port} lies in the kernel's ephemeral range {First}-{Last} (net.ipv4.ip_local_port_range), which outgoing connections in Tern's network namespace (the machine's, or the pod's) draw from; while one holds the port, Tern cannot bind it at its next start: {Advice}")]
    public static partial void PortInEphemeralRange(ILogger logger, string key, int port, int first, int last, string advice);

    [LoggerMessage(407, LogLevel.Error, "Accepting connections on {Endpoint} fails: {Reason}. New clients wait in the listen backlog (up to {Backlog}, or net.core.somaxconn if lower) while Tern tries again every {RetryMs} ms; open connections are served as before. {Advice}")]
    public static partial void AcceptFailing(ILogger logger, string endpoint, string reason, int backlog, int retryMs, string advice);

    [LoggerMessage(408, LogLevel.Information, "Accepting connections on {Endpoint} works again, {Seconds:0.0} s after the last report of failures ({Failures} more since)")]
    public static partial void AcceptRecovered(ILogger logger, string endpoint, double seconds, long failures);

    [LoggerMessage(409, LogLevel.Warning, "This runtime's Kestrel lacks what Tern's accept loop needs (SocketConnectionFactoryOptions(SocketTransportOptions)); Kestrel's own loop accepts connections, and spins if the process runs out of files")]
    public static partial void KestrelAcceptLoop(ILogger logger);

    [LoggerMessage(410, LogLevel.Warning, "Tern could not open /dev/null, with which it counts its free descriptors: new upstream connections may take the last of its descriptors (see README, Listeners)")]
    public static partial void NoDescriptorProbe(ILogger logger);
}
