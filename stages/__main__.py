from stages import main

main()
