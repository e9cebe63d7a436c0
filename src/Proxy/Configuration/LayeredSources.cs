using Microsoft.Extensions.Configuration;

namespace Tern.Proxy.Configuration;

/// <summary>
/// A null or empty value in a later source (JSON's null or [], an empty variable or argument) over
/// settings an earlier one gives under the same key: <c>"default": null</c> in TERN_CONFIG, written
/// to drop the shipped route, or <c>"TrustedProxies": []</c> to trust none. .NET's configuration lays
/// sources over each other key by key, so the value takes nothing away, and the route and the
/// trusted proxies stayed in force without a word. Refused, naming both. A JSON {} is a section
/// left empty (a skeleton), and asks for nothing.
/// </summary>
internal static class LayeredSources
{
    /// <summary>One of Tern's sources: how it is named, and which keys it sets empty.</summary>
    internal interface ILayer
    {
        /// <summary>How errors name the source where it sets key (TERN_CONFIG (/path), the environment (X__Y)).</summary>
        string Label(string key);

        /// <summary>The keys it sets to an empty value with nothing of its own under them.</summary>
        IEnumerable<string> EmptyLeaves();
    }

    public static IEnumerable<ConfigurationProblem> Problems(IConfiguration configuration)
    {
        if (configuration is not IConfigurationRoot root)
        {
            yield break;
        }

        var providers = root.Providers.ToList();
        for (var later = 1; later < providers.Count; later++)
        {
            if (providers[later] is not ILayer layer)
            {
                continue;
            }

            foreach (var key in layer.EmptyLeaves())
            {
                var earlier = providers.Take(later).FirstOrDefault(p => p.GetChildKeys([], key).Any());
                if (earlier is not null)
                {
                    var where = earlier is ILayer named ? named.Label(key) : "an earlier source";
                    var instead = key.StartsWith(ReverseProxyValidator.Section + ":", StringComparison.OrdinalIgnoreCase)
                        ? "; a route or cluster is replaced by one of the same name, which overrides its settings one by one (README, \"Pointing Tern at a real app\")"
                        : "; give the settings under it new values instead";
                    yield return new ConfigurationProblem(key, $"a null or empty value in {layer.Label(key)} takes nothing away: sources are laid over each other key by key, and what {where} sets under {key} stays in force{instead}");
                }
            }
        }
    }
}
