using Tern.Proxy.Configuration;

namespace Tern.Proxy.Tls;

/// <summary>
/// The certificates in force, chosen by SNI: an exact host first, then a wildcard for the
/// parent domain, then the default (the certificate with no hosts, else the first one).
/// Immutable: a reload builds a new set and swaps it in.
/// </summary>
public sealed class CertificateSet
{
    private readonly Dictionary<string, ServerCertificate> _exact = new(StringComparer.OrdinalIgnoreCase);
    private readonly Dictionary<string, ServerCertificate> _wildcard = new(StringComparer.OrdinalIgnoreCase);

    private CertificateSet(ServerCertificate fallback, IReadOnlyList<ServerCertificate> all)
    {
        Default = fallback;
        All = all;
    }

    public ServerCertificate Default { get; }

    public IReadOnlyList<ServerCertificate> All { get; }

    public ServerCertificate Select(string? serverName)
    {
        if (!string.IsNullOrEmpty(serverName))
        {
            var name = HostPattern.Normalize(serverName);
            if (_exact.TryGetValue(name, out var exact))
            {
                return exact;
            }

            var parent = HostPattern.ParentDomain(name);
            if (parent is not null && _wildcard.TryGetValue(parent, out var wildcard))
            {
                return wildcard;
            }
        }

        return Default;
    }

    /// <summary>Loads every configured certificate; problems name the key. Null when any failed.</summary>
    internal static CertificateSet? Load(IReadOnlyList<CertificateSettings> settings, List<ConfigurationProblem> problems)
    {
        var before = problems.Count;
        var loaded = new List<(CertificateSettings Settings, ServerCertificate Certificate)>();
        foreach (var entry in settings)
        {
            var certificate = CertificateLoader.Load(entry, $"Tern:Tls:Certificates:{entry.Name}", problems);
            if (certificate is not null)
            {
                loaded.Add((entry, certificate));
            }
        }

        CertificateLoader.Forget(settings.Select(s => s.Name));
        if (loaded.Count != settings.Count || loaded.Count == 0)
        {
            return null;
        }

        var defaults = loaded.Where(l => l.Settings.Hosts.Count == 0).ToList();
        if (defaults.Count > 1)
        {
            problems.Add(new($"Tern:Tls:Certificates:{defaults[1].Settings.Name}:Hosts",
                $"only one certificate may have no Hosts (the default); '{defaults[0].Settings.Name}' already is"));
            return null;
        }

        var set = new CertificateSet((defaults.Count == 1 ? defaults[0] : loaded[0]).Certificate, loaded.Select(l => l.Certificate).ToList());
        var owners = new Dictionary<string, string>(StringComparer.OrdinalIgnoreCase);
        foreach (var (entry, certificate) in loaded)
        {
            foreach (var host in entry.Hosts.Select(HostPattern.Normalize))
            {
                if (!owners.TryAdd(host, entry.Name))
                {
                    problems.Add(new($"Tern:Tls:Certificates:{entry.Name}:Hosts", $"host '{host}' is already served by certificate '{owners[host]}'"));
                    continue;
                }

                if (HostPattern.IsWildcard(host))
                {
                    set._wildcard[host[2..]] = certificate;
                }
                else
                {
                    set._exact[host] = certificate;
                }
            }
        }

        return problems.Count == before ? set : null;
    }
}
