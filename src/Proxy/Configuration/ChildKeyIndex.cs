using Microsoft.Extensions.Configuration;
using Microsoft.Extensions.Configuration.CommandLine;
using Microsoft.Extensions.Configuration.EnvironmentVariables;

namespace Tern.Proxy.Configuration;

/// <summary>
/// A configuration provider's child keys, indexed once per load. .NET's <see
/// cref="ConfigurationProvider.GetChildKeys"/> scans every key the provider holds, and listing or
/// binding a section asks every provider once per node of it, so reading a section costs its size
/// times the provider's: with 500 routes (8,000 values) a reload spent 1.1 s of CPU listing and
/// reading ReverseProxy, and 4.0 s with 1,000 (loadtest/README.md has the measurements). The index
/// answers from the keys under the asked parent alone, with the same keys in the same order: this
/// provider's (each once, as first seen, where .NET lists one per key under it and the
/// configuration root keeps the first of equal keys), then the earlier providers', sorted by
/// <see cref="ConfigurationKeyComparer"/> keeping equal keys in that order. One difference: .NET
/// sorts with List.Sort, which keeps equal keys in order only up to 16 of them, so past that the
/// casing it shows for a key two providers spell differently (route5, ROUTE5), or the order of
/// keys equal as numbers (1, 01), is left to chance; the index always shows the later provider's
/// casing and the first-seen order. Values never differ.
/// </summary>
internal sealed class ChildKeyIndex
{
    private Built? _built;

    public IEnumerable<string> ChildKeys(IDictionary<string, string?> data, IEnumerable<string> earlierKeys, string? parentPath)
    {
        var built = Current(data);
        var own = parentPath is null ? built.Root : built.Children.GetValueOrDefault(parentPath);
        var keys = own is null ? earlierKeys : own.Concat(earlierKeys);
        return keys.OrderBy(key => key, ConfigurationKeyComparer.Instance);
    }

    /// <summary>
    /// The keys data sets to an empty value (an empty variable or argument) with nothing of its
    /// own under them: in a later source, meant to take away what an earlier one sets under the
    /// key, which configuration does not do (see <see cref="LayeredSources"/>).
    /// </summary>
    public IEnumerable<string> EmptyLeaves(IDictionary<string, string?> data)
    {
        var built = Current(data);
        return data.Where(pair => string.IsNullOrWhiteSpace(pair.Value) && !built.Children.ContainsKey(pair.Key)).Select(pair => pair.Key);
    }

    private Built Current(IDictionary<string, string?> data)
    {
        var built = Volatile.Read(ref _built);
        if (built is null || !ReferenceEquals(built.Data, data) || built.Count != data.Count)
        {
            // Providers replace their dictionary on every load, and their Set only adds keys or
            // changes values: a new dictionary or a new count is new keys.
            built = Build(data);
            Volatile.Write(ref _built, built);
        }

        return built;
    }

    private static Built Build(IDictionary<string, string?> data)
    {
        // Counted first: a key added while the index is built then shows as a change next time.
        var count = data.Count;
        var root = new Children();
        var children = new Dictionary<string, Children>(StringComparer.OrdinalIgnoreCase);
        var lookup = children.GetAlternateLookup<ReadOnlySpan<char>>();
        foreach (var key in data.Keys)
        {
            var colon = key.IndexOf(ConfigurationPath.KeyDelimiter, StringComparison.Ordinal);
            root.Add(colon < 0 ? key.AsSpan() : key.AsSpan(0, colon));
            while (colon >= 0)
            {
                var parent = key.AsSpan(0, colon);
                var next = key.IndexOf(ConfigurationPath.KeyDelimiter, colon + 1, StringComparison.Ordinal);
                var segment = next < 0 ? key.AsSpan(colon + 1) : key.AsSpan(colon + 1, next - colon - 1);
                if (!lookup.TryGetValue(parent, out var under))
                {
                    under = new Children();
                    lookup[parent] = under;
                }

                under.Add(segment);
                colon = next;
            }
        }

        return new Built(data, count, children.ToDictionary(pair => pair.Key, pair => pair.Value.Keys, StringComparer.OrdinalIgnoreCase), root.Keys);
    }

    private sealed record Built(IDictionary<string, string?> Data, int Count, Dictionary<string, List<string>> Children, List<string> Root);

    /// <summary>One parent's child keys, each once (ignoring case), in the order first seen.</summary>
    private sealed class Children
    {
        private readonly HashSet<string>.AlternateLookup<ReadOnlySpan<char>> _seen =
            new HashSet<string>(StringComparer.OrdinalIgnoreCase).GetAlternateLookup<ReadOnlySpan<char>>();

        public List<string> Keys { get; } = [];

        public void Add(ReadOnlySpan<char> segment)
        {
            if (!_seen.Contains(segment))
            {
                var key = segment.ToString();
                _seen.Set.Add(key);
                Keys.Add(key);
            }
        }
    }
}

/// <summary>Environment variables (Tern__Https__Port), with their child keys indexed.</summary>
internal sealed class IndexedEnvironmentVariables : IConfigurationSource
{
    public IConfigurationProvider Build(IConfigurationBuilder builder) => new Provider();

    private sealed class Provider : EnvironmentVariablesConfigurationProvider, LayeredSources.ILayer
    {
        private readonly ChildKeyIndex _index = new();

        public override IEnumerable<string> GetChildKeys(IEnumerable<string> earlierKeys, string? parentPath) =>
            _index.ChildKeys(Data, earlierKeys, parentPath);

        public string Label(string key) => $"the environment ({UnreadSetting.Environment(key)})";

        public IEnumerable<string> EmptyLeaves() => _index.EmptyLeaves(Data);
    }
}

/// <summary>The command line (--Tern:Https:Port=8443), with its child keys indexed.</summary>
internal sealed class IndexedCommandLine(IEnumerable<string> args) : IConfigurationSource
{
    public IConfigurationProvider Build(IConfigurationBuilder builder) => new Provider(args);

    private sealed class Provider(IEnumerable<string> args) : CommandLineConfigurationProvider(args), LayeredSources.ILayer
    {
        private readonly ChildKeyIndex _index = new();

        public override IEnumerable<string> GetChildKeys(IEnumerable<string> earlierKeys, string? parentPath) =>
            _index.ChildKeys(Data, earlierKeys, parentPath);

        public string Label(string key) => "the command line";

        public IEnumerable<string> EmptyLeaves() => _index.EmptyLeaves(Data);
    }
}
