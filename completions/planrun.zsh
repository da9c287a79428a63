#compdef planrun

_planrun_completion() {
  eval $(env _TYPER_COMPLETE_ARGS="${words[1,$CURRENT]}" _PLANRUN_COMPLETE=complete_zsh planrun)
}

compdef _planrun_completion planrun
if [[ "${funcstack[1]}" == "_planrun" ]]; then
  _planrun_completion "$@"
fi
