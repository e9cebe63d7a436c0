using System.Net;
using Tern.Proxy.Tls;

namespace Tern.Proxy.Configuration;

/// <summary>Tern's own settings (the "Tern" section), read and checked as one immutable snapshot.</summary>
public sealed record TernSettings
{
    public const string Section = "Tern";

    public int HttpsPort { get; init; } = 8443;

    public int HttpPort { get; init; } = 8080;

    /// <summary>
    /// The HTTPS port that plain-HTTP redirects point to (what clients see, e.g. 443 behind a
    /// Service); null for the HTTPS port Tern listens on, which is the bound one: a port changed
    /// by a reload is not listened on until a restart.
    /// </summary>
    public int? RedirectHttpsPort { get; init; }

    public int ManagementPort { get; init; } = 9090;

    public string TlsEngine { get; init; } = TlsEngines.OpenSsl;

    /// <summary>Whether the HTTPS listener asks clients for a certificate (mutual TLS).</summary>
    public ClientCertificateMode ClientCertificateMode { get; init; } = ClientCertificateMode.None;

    /// <summary>PEM file of the CAs that issue client certificates (required unless the mode is None).</summary>
    public string? TrustedClientCaPath { get; init; }

    public TimeSpan HandshakeTimeout { get; init; } = TimeSpan.FromSeconds(10);

    public IReadOnlyList<CertificateSettings> Certificates { get; init; } = [];

    public string SelfSignedDirectory { get; init; } = DefaultSelfSignedDirectory;

    /// <summary>A file of 80-byte session ticket keys shared by replicas (OpenSSL engine); null for per-process random keys.</summary>
    public string? SessionTicketKeysPath { get; init; }

    public IReadOnlyList<IPNetwork> TrustedProxies { get; init; } = [];

    /// <summary>Whether request headers whose names have an underscore are forwarded (nginx's underscores_in_headers).</summary>
    public bool UnderscoresInHeaders { get; init; }

    /// <summary>Whether the upstream's Server response header reaches the client (nginx's proxy_pass_header Server).</summary>
    public bool PassServerHeader { get; init; }

    /// <summary>Whether an upstream's Location (and Refresh URL) at its own address becomes the client's path (nginx's proxy_redirect default).</summary>
    public bool RewriteRedirects { get; init; } = true;

    public TimeSpan ConnectTimeout { get; init; } = TimeSpan.FromMilliseconds(800);

    /// <summary>How long an upstream connection may wait unused in the pool before Tern closes it (.NET's default).</summary>
    public TimeSpan PooledConnectionIdleTimeout { get; init; } = TimeSpan.FromMinutes(1);

    public TimeSpan DrainTimeout { get; init; } = TimeSpan.FromSeconds(30);

    /// <summary>Whether /metrics also exports the instruments updated on every request for what is in flight (see MetricsEndpoint.InFlightInstruments).</summary>
    public bool MetricsInFlight { get; init; }

    public bool DemoEnabled { get; init; }

    public int DemoPort { get; init; } = 8081;

    /// <summary>The checked values under Kestrel:Limits (see Listeners/ListenerLimits), applied at start.</summary>
    public IReadOnlyList<KeyValuePair<string, string?>> ListenerLimits { get; init; } = [];

    internal static string DefaultSelfSignedDirectory =>
        Path.Combine(Environment.GetFolderPath(Environment.SpecialFolder.LocalApplicationData, Environment.SpecialFolderOption.DoNotVerify), "tern", "certs");

    /// <summary>Reads the Tern section; every problem lands in reader.Problems with its key.</summary>
    internal static TernSettings Read(SettingReader reader)
    {
        var defaults = new TernSettings();
        var settings = new TernSettings
        {
            HttpsPort = reader.Port("Tern:Https:Port", defaults.HttpsPort),
            HttpPort = reader.Port("Tern:Http:Port", defaults.HttpPort),
            RedirectHttpsPort = reader.String("Tern:Http:RedirectHttpsPort") is null ? null : reader.Port("Tern:Http:RedirectHttpsPort", defaults.HttpsPort),
            ManagementPort = reader.Port("Tern:Management:Port", defaults.ManagementPort),
            TlsEngine = reader.OneOf("Tern:Tls:Engine", [TlsEngines.OpenSsl, TlsEngines.SslStream], TlsEngines.OpenSsl, "a TLS engine"),
            ClientCertificateMode = Enum.Parse<ClientCertificateMode>(reader.OneOf("Tern:Https:ClientCertificates:Mode",
                Enum.GetNames<ClientCertificateMode>(), nameof(ClientCertificateMode.None), "a client certificate mode")),
            TrustedClientCaPath = reader.String("Tern:Https:ClientCertificates:TrustedCaPath"),
            HandshakeTimeout = reader.Duration("Tern:Tls:HandshakeTimeout", defaults.HandshakeTimeout),
            Certificates = ReadCertificates(reader),
            SelfSignedDirectory = reader.String("Tern:Tls:SelfSignedDirectory") ?? defaults.SelfSignedDirectory,
            SessionTicketKeysPath = reader.String("Tern:Tls:SessionTicketKeys"),
            TrustedProxies = ReadNetworks(reader, "Tern:Forwarding:TrustedProxies"),
            UnderscoresInHeaders = reader.Bool("Tern:Forwarding:UnderscoresInHeaders", defaults.UnderscoresInHeaders),
            PassServerHeader = reader.Bool("Tern:Forwarding:PassServerHeader", defaults.PassServerHeader),
            RewriteRedirects = reader.Bool("Tern:Forwarding:RewriteRedirects", defaults.RewriteRedirects),
            ConnectTimeout = reader.Duration("Tern:Forwarding:ConnectTimeout", defaults.ConnectTimeout),
            PooledConnectionIdleTimeout = reader.Duration("Tern:Forwarding:PooledConnectionIdleTimeout", defaults.PooledConnectionIdleTimeout),
            DrainTimeout = reader.Duration("Tern:Shutdown:DrainTimeout", defaults.DrainTimeout),
            MetricsInFlight = reader.Bool("Tern:Metrics:InFlight", defaults.MetricsInFlight),
            DemoEnabled = reader.Bool("Tern:Demo:Enabled", defaults.DemoEnabled),
            DemoPort = reader.Port("Tern:Demo:Port", defaults.DemoPort),
        };

        CheckDistinctPorts(reader, settings);
        return settings;
    }

    /// <summary>The listeners this configuration binds, with the key that sets each port.</summary>
    internal IEnumerable<(string Key, int Port)> ListenerPorts()
    {
        yield return ("Tern:Https:Port", HttpsPort);
        yield return ("Tern:Http:Port", HttpPort);
        yield return ("Tern:Management:Port", ManagementPort);
        if (DemoEnabled)
        {
            yield return ("Tern:Demo:Port", DemoPort);
        }
    }

    /// <summary>
    /// Settings applied at start only (listeners, engine, drain, metrics), as key and value text,
    /// for a Tern running boundEngine: the engine a reload names applies only after a restart.
    /// </summary>
    internal IEnumerable<(string Key, string Value)> StartOnlySettings(string boundEngine)
    {
        foreach (var (key, port) in ListenerPorts())
        {
            yield return (key, port.ToString(System.Globalization.CultureInfo.InvariantCulture));
        }

        foreach (var limit in Listeners.ListenerLimits.Effective(ListenerLimits))
        {
            yield return limit;
        }

        yield return ("Tern:Demo:Enabled", DemoEnabled ? "true" : "false");
        yield return ("Tern:Tls:Engine", TlsEngine);
        yield return ("Tern:Metrics:InFlight", MetricsInFlight ? "true" : "false");
        yield return ("Tern:Shutdown:DrainTimeout", DrainTimeout.ToString("c", System.Globalization.CultureInfo.InvariantCulture));
        yield return ("Tern:Forwarding:ConnectTimeout", ConnectTimeout.ToString("c", System.Globalization.CultureInfo.InvariantCulture));
        yield return ("Tern:Forwarding:PooledConnectionIdleTimeout", PooledConnectionIdleTimeout.ToString("c", System.Globalization.CultureInfo.InvariantCulture));
        if (boundEngine == TlsEngines.SslStream)
        {
            yield return ("Tern:Tls:HandshakeTimeout", HandshakeTimeout.ToString("c", System.Globalization.CultureInfo.InvariantCulture));
        }
    }

    private static void CheckDistinctPorts(SettingReader reader, TernSettings settings)
    {
        var seen = new Dictionary<int, string>();
        foreach (var (key, port) in settings.ListenerPorts())
        {
            if (!seen.TryAdd(port, key))
            {
                reader.Add(key, $"port {port} is already used by {seen[port]}; each listener needs its own port");
            }
        }
    }

    private static List<CertificateSettings> ReadCertificates(SettingReader reader)
    {
        var certificates = new List<CertificateSettings>();
        foreach (var name in reader.Names("Tern:Tls:Certificates"))
        {
            var prefix = $"Tern:Tls:Certificates:{name}";
            var certificatePath = reader.String($"{prefix}:CertificatePath");
            var keyPath = reader.String($"{prefix}:KeyPath");
            var hosts = reader.List($"{prefix}:Hosts");
            if (certificatePath is null)
            {
                reader.Add($"{prefix}:CertificatePath", "is required: the path of a PEM certificate file (tls.crt)");
            }

            if (keyPath is null)
            {
                reader.Add($"{prefix}:KeyPath", "is required: the path of a PEM private key file (tls.key)");
            }

            foreach (var host in hosts)
            {
                if (!HostPattern.IsValid(host))
                {
                    reader.Add($"{prefix}:Hosts", $"'{host}' is not a host name or a wildcard like *.example.com");
                }
            }

            if (certificatePath is not null && keyPath is not null)
            {
                certificates.Add(new CertificateSettings(name, certificatePath, keyPath, hosts));
            }
        }

        return certificates;
    }

    private static List<IPNetwork> ReadNetworks(SettingReader reader, string key)
    {
        var networks = new List<IPNetwork>();
        foreach (var text in reader.List(key))
        {
            if (IPNetwork.TryParse(text, out var network))
            {
                networks.Add(network);
            }
            else if (IPAddress.TryParse(text, out var address))
            {
                networks.Add(new IPNetwork(address, address.AddressFamily == System.Net.Sockets.AddressFamily.InterNetwork ? 32 : 128));
            }
            else
            {
                reader.Add(key, $"'{text}' is not an IP address or a CIDR range like 10.0.0.0/8");
            }
        }

        return networks;
    }
}

/// <summary>One entry of Tern:Tls:Certificates.</summary>
public sealed record CertificateSettings(string Name, string CertificatePath, string KeyPath, IReadOnlyList<string> Hosts);
