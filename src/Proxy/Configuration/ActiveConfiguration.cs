namespace Tern.Proxy.Configuration;

/// <summary>The configuration in force: the last one that passed every check.</summary>
public sealed class ActiveConfiguration(ConfigurationSnapshot initial)
{
    private volatile ConfigurationSnapshot _current = initial;

    /// <summary>
    /// The settings the listeners were bound with. Ports, engine and drain time apply at start
    /// only, so whatever tells listeners apart must use these, not a reloaded value.
    /// </summary>
    public TernSettings Bound { get; } = initial.Settings;

    public ConfigurationSnapshot Current => _current;

    internal void Replace(ConfigurationSnapshot snapshot) => _current = snapshot;
}
