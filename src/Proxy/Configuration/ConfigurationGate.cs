using Microsoft.Extensions.Configuration;

namespace Tern.Proxy.Configuration;

/// <summary>
/// A copy of one section of the live configuration, updated only once the whole configuration
/// has passed Tern's checks, so an invalid edit never reaches what reads it and the last good
/// values stay in force. YARP reads its routes and clusters from one ("ReverseProxy"; it still
/// parses them with its own reader and runs its own validation on top), .NET's logging its
/// levels from another ("Logging"): a rejected edit, or a file caught half-saved (which .NET
/// loads as empty), changes neither.
/// </summary>
internal sealed class ConfigurationGate : ConfigurationProvider, IConfigurationSource
{
    private readonly ChildKeyIndex _index = new();

    public ConfigurationGate() => Root = new ConfigurationRoot([this]);

    public IConfigurationRoot Root { get; }

    public IConfigurationProvider Build(IConfigurationBuilder builder) => this;

    public void Publish(IEnumerable<KeyValuePair<string, string?>> data)
    {
        Data = new Dictionary<string, string?>(data, StringComparer.OrdinalIgnoreCase);
        OnReload();
    }

    /// <summary>Indexed: YARP reads every route and cluster through these (see ChildKeyIndex).</summary>
    public override IEnumerable<string> GetChildKeys(IEnumerable<string> earlierKeys, string? parentPath) =>
        _index.ChildKeys(Data, earlierKeys, parentPath);
}
